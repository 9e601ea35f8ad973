"""loadgen/chat.py in Locust's web UI, driven through its HTTP endpoints: each run takes the form's values."""

import json
import os
import socket
import subprocess
import time

import pytest
import requests
from locust_harness import LOCUST, REPO, read_summary

from loadgen.options import PROFILES


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def web_ui(mock_process, tmp_path):
    """Locust with its web UI on a free port, against the mock server; yields (ui url, mock host)."""
    server = mock_process(ttft_s=0.02, itl_s=0.01)
    host = f"http://127.0.0.1:{server.port}"
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([str(LOCUST), "-f", str(REPO / "loadgen" / "chat.py"), "--web-host", "127.0.0.1",
                             "--web-port", str(port), "--host", host, "--output-tokens", "4",
                             "--prompt-tokens", "8"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            requests.get(url + "/", timeout=2)
            break
        except requests.exceptions.ConnectionError:
            assert proc.poll() is None and time.monotonic() < deadline, "the web UI did not start"
            time.sleep(0.3)
    yield url, host
    proc.terminate()
    proc.communicate(timeout=30)


def swarm(url: str, host: str, **fields) -> dict:
    form = {"user_count": "2", "spawn_rate": "2", "host": host, "run_time": "2s", **fields}
    return requests.post(url + "/swarm", data=form, timeout=30).json()


def finished_summary(url: str, report_dir) -> dict:
    """The run's summary once the run stopped and its report is written (the plots take seconds, and
    the web UI answers nothing while they are drawn: a busy machine makes that long)."""
    deadline = time.monotonic() + 90
    time.sleep(1.0)
    while (requests.get(url + "/stats/requests", timeout=60).json()["state"] != "stopped"
           or not (report_dir / "loadgen_summary.json").exists()):
        assert time.monotonic() < deadline, "the run did not stop, or wrote no report"
        time.sleep(0.3)
    time.sleep(0.5)  # the summary is written before the CSV and the plots
    return read_summary(report_dir)


def test_the_profile_is_a_choice_list_and_the_default_report_folder_is_reports(web_ui):
    url, _ = web_ui
    page = requests.get(url + "/", timeout=60).text
    args = json.loads(page.split("window.templateArgs = ", 1)[1].split("\n", 1)[0])
    extra = args["extra_options"]
    assert extra["load_profile"]["choices"] == list(PROFILES)
    assert extra["report_dir"]["default_value"] == "reports"


def test_each_run_takes_the_forms_values_and_bad_values_are_refused(web_ui, tmp_path):
    url, host = web_ui
    answer = swarm(url, host, load_profile="burst")
    assert answer["success"] is False
    assert answer["message"] == ("loadgen: --profile 'burst' is not a load profile; choose one of steady, ramp, "
                                 "spike, step, poisson, long-context, shared-prefix, dynamic-prefix, abort, "
                                 "multi-turn")
    assert swarm(url, host, profile="nightly")["success"] is False  # Locust's own field, where no list choice is made
    assert "--rate must be a number, got 'fast'" in swarm(url, host, load_profile="steady", rate="fast")["message"]

    assert swarm(url, host, load_profile="abort", abort_after_tokens="2", report_dir="first")["success"] is True
    first = finished_summary(url, tmp_path / "first")
    assert first["profile"] == "abort" and first["num_failed"] == first["num_succeeded"] == 0 < first["num_aborted"]

    # The second run: another profile and folder from the form, nothing kept from the first.
    answer = swarm(url, host, load_profile="steady", report_dir="second")
    assert answer["success"] is True, answer
    second = finished_summary(url, tmp_path / "second")
    assert second["profile"] == "steady" and second["num_aborted"] == 0 and second["num_succeeded"] > 0

    # No choice in the list: Locust's own profile field names it.
    assert swarm(url, host, load_profile="", profile="spike", report_dir="third")["success"] is True
    assert finished_summary(url, tmp_path / "third")["profile"] == "spike"
