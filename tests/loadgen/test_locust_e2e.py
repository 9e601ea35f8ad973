"""Headless locust runs of loadgen/chat.py against the mock SSE server with known delays and faults."""

import csv
import json

import pytest
from locust_harness import read_summary, run_locust

from loadgen.options import PROFILES
from loadgen.report import REQUESTS_CSV, SUMMARY_JSON, SUMMARY_MD

TOLERANCE_S = 0.015  # client-side measurement error allowed on a shared 2-core machine

DATASET = [
    {"id": "a", "conversations": [{"from": "human", "value": "alpha question about paging"},
                                  {"from": "gpt", "value": "answer"}]},
    {"id": "b", "conversations": [{"from": "human", "value": "beta question about prefix caching"},
                                  {"from": "gpt", "value": "answer"}]},
]


def locust_args(port: int, report_dir, *extra: str) -> list[str]:
    return ["--host", f"http://127.0.0.1:{port}", "--report-dir", str(report_dir), *extra]


def test_measured_ttft_and_itl_match_the_injected_delays(mock_process, tmp_path):
    server = mock_process(ttft_s=0.2, itl_s=0.05)
    dataset = tmp_path / "sharegpt.json"
    dataset.write_text(json.dumps(DATASET))
    proc = run_locust(locust_args(server.port, tmp_path / "rep", "-u", "4", "-r", "4", "-t", "4s",
                                  "--dataset", str(dataset), "--output-tokens", "8", "--slo-ttft-ms", "300",
                                  "--csv", str(tmp_path / "locust")), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = read_summary(tmp_path / "rep")
    assert s["num_succeeded"] >= 8 and s["num_failed"] == 0
    assert abs(s["ttft_s"]["p50"] - 0.2) < TOLERANCE_S
    assert abs(s["itl_s"]["p50"] - 0.05) < TOLERANCE_S
    assert abs(s["tpot_s"]["p50"] - 0.05) < TOLERANCE_S
    assert abs(s["e2e_s"]["p50"] - (0.2 + 7 * 0.05)) < 2 * TOLERANCE_S
    assert s["itl_s"]["count"] == 7 * s["num_succeeded"]
    assert s["output_tokens_source"] == {"usage": s["num_succeeded"], "chunks": 0}
    assert s["goodput_rps"] is not None and s["num_good"] <= s["num_succeeded"]
    for key in ("p50", "p90", "p95", "p99"):
        assert isinstance(s["ttft_s"][key], float)
    # Every prompt came from the dataset, every request asked for exactly 8 tokens.
    stats = server.stats
    assert set(stats.prompts) <= {"alpha question about paging", "beta question about prefix caching"}
    assert set(stats.max_tokens) == {8}
    assert "| TTFT |" in (tmp_path / "rep" / SUMMARY_MD).read_text()
    rows = list(csv.DictReader(open(tmp_path / "rep" / REQUESTS_CSV)))
    assert len(rows) == s["num_requests"]
    for name in ("loadgen_latency.png", "loadgen_throughput.png", "loadgen_concurrency.png"):
        assert (tmp_path / "rep" / name).stat().st_size > 1000
    stats_rows = {(r["Type"], r["Name"]) for r in csv.DictReader(open(tmp_path / "locust_stats.csv"))}
    assert {("TTFT", "chat"), ("TPOT", "chat"), ("ITL", "chat"), ("E2E", "chat"), ("POST", "chat")} <= stats_rows


def test_failures_are_counted_by_kind_and_cut_streams_never_succeed(mock_process, tmp_path):
    server = mock_process(ttft_s=0.02, itl_s=0.01, faults=("ok", "cut", "error", "http503", "nodone"))
    log = tmp_path / "client.log"
    proc = run_locust(locust_args(server.port, tmp_path, "-u", "3", "-r", "3", "-t", "2s", "--output-tokens", "6",
                                  "--client-log", str(log)), tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]  # Locust's exit code when requests failed
    s = read_summary(tmp_path)
    modes = server.stats.modes
    modes = {k: modes.get(k, 0) for k in ("ok", "cut", "error", "http503", "nodone")}
    assert s["num_requests"] == sum(modes.values()) and s["num_incomplete"] == 0
    assert s["num_succeeded"] == modes["ok"]
    assert s["failures"] == {"stream_cut": modes["cut"] + modes["nodone"], "error_event": modes["error"],
                             "http_status": modes["http503"], "timeout": 0, "connect_error": 0}
    lines = log.read_text().splitlines()
    assert len(lines) == s["num_failed"]
    assert sum("requests.exceptions.ChunkedEncodingError: " in line for line in lines) == modes["cut"]
    assert sum("kind=http_status status=503" in line for line in lines) == modes["http503"]


def test_abort_profile_counts_intentional_cancels_not_failures(mock_process, tmp_path):
    server = mock_process(ttft_s=0.02, itl_s=0.02)
    proc = run_locust(locust_args(server.port, tmp_path, "-u", "2", "-r", "2", "-t", "2s", "--profile", "abort",
                                  "--abort-after-tokens", "2", "--output-tokens", "50", "--prompt-tokens", "40"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = read_summary(tmp_path)
    assert s["profile"] == "abort"
    stats = server.stats
    assert s["num_aborted"] == s["num_requests"] == stats.num_requests > 0
    assert s["num_failed"] == 0
    assert s["ttft_s"]["count"] == s["num_aborted"] and s["itl_s"]["count"] == s["num_aborted"]  # 2 chunks: 1 gap
    assert s["e2e_s"]["count"] == 0
    # The mock counts one token per word, so the calibrated generator hits the asked length exactly.
    assert set(stats.prompt_words) == {40}


def test_poisson_is_open_loop_and_counts_latency_from_the_scheduled_send(mock_process, tmp_path):
    # One in flight at most, ~0.1 s each, 20 arrivals per second: the client falls behind the schedule.
    server = mock_process(ttft_s=0.05, itl_s=0.025)
    proc = run_locust(locust_args(server.port, tmp_path, "-t", "2s", "--profile", "poisson", "--rate", "20",
                                  "--max-concurrency", "1", "--output-tokens", "3", "--seed", "3"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = read_summary(tmp_path)
    assert s["profile"] == "poisson" and s["num_failed"] == 0
    assert s["client_queue_s"]["max"] > 0.2
    # TTFT counts from the slot, so it carries the client's queue: far above the injected 50 ms.
    assert s["ttft_s"]["max"] >= s["client_queue_s"]["max"] + 0.05 - 0.002
    assert s["ttft_s"]["p90"] > 0.2


def test_processes_merge_worker_records_into_one_report(mock_process, tmp_path):
    server = mock_process(ttft_s=0.05, itl_s=0.02)
    proc = run_locust(locust_args(server.port, tmp_path, "--processes", "2", "-u", "4", "-r", "4", "-t", "2s",
                                  "--profile", "shared-prefix", "--prefix-tokens", "64", "--prompt-tokens", "8",
                                  "--output-tokens", "4"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = read_summary(tmp_path)
    rows = list(csv.DictReader(open(tmp_path / REQUESTS_CSV)))
    assert {r["worker"] for r in rows} == {"worker-0", "worker-1"}
    assert s["profile"] == "shared-prefix"  # the master's profile reached the workers
    assert s["num_requests"] == server.stats.num_requests
    pc = s["prefix_cache"]
    assert 0.5 < pc["best_possible_hit_rate"] < 1.0
    assert pc["measured_hit_rate"] <= pc["best_possible_hit_rate"] + 1e-9


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    proc = run_locust(["--host", "http://127.0.0.1:9", "-t", "1s", "--dataset", "missing.json"], tmp_path)
    assert proc.returncode == 2
    assert "loadgen: error: dataset missing.json: cannot read: No such file or directory\n" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / SUMMARY_JSON).exists()


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_runs_headless(mock_process, tmp_path, profile):
    server = mock_process(ttft_s=0.02, itl_s=0.01)
    proc = run_locust(locust_args(server.port, tmp_path, "-u", "2", "-r", "2", "-t", "2s", "--profile", profile,
                                  "--stage-s", "0.5", "--rate", "4", "--prompt-tokens", "16", "--output-tokens", "4",
                                  "--prefix-tokens", "32", "--turns", "2", "--max-model-len", "256"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = read_summary(tmp_path)
    assert s["profile"] == profile and s["num_failed"] == 0
    assert s["num_requests"] == server.stats.num_requests > 0  # (the mock counts streamed requests only)
    if profile == "abort":
        assert s["num_aborted"] > 0 and s["num_succeeded"] == 0
    else:
        assert s["num_succeeded"] > 0 and s["num_aborted"] == 0


def test_a_silent_stream_times_out_through_the_watchdog(mock_process, tmp_path):
    """Under Locust (gevent sockets) the body's read timeout is the watchdog's, worded as requests'."""
    server = mock_process(ttft_s=0.02, itl_s=0.01, faults=("ok", "hang"))
    log = tmp_path / "client.log"
    proc = run_locust(locust_args(server.port, tmp_path, "-u", "2", "-r", "2", "-t", "3s", "--output-tokens", "6",
                                  "--timeout-s", "0.5", "--client-log", str(log)), tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    s = read_summary(tmp_path)
    modes = server.stats.modes
    assert s["num_succeeded"] == modes["ok"] and s["num_incomplete"] == 0
    assert s["failures"]["timeout"] == modes["hang"] >= 2 and s["num_failed"] == modes["hang"]
    lines = log.read_text().splitlines()
    assert len(lines) == modes["hang"]
    assert all(" kind=timeout status=200 " in line and line.endswith(
        f"requests.exceptions.ConnectionError: HTTPConnectionPool(host='127.0.0.1', port={server.port}): "
        "Read timed out.") for line in lines)
    rows = [r for r in csv.DictReader(open(tmp_path / REQUESTS_CSV)) if r["failure_kind"] == "timeout"]
    assert all(int(r["num_chunks"]) == 3 for r in rows)  # the mock goes silent after 3 tokens
