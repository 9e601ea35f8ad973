"""The checks of a scenario's verdict, on hand-made inputs: runbooks, alerts, triage, access log."""


from gameday.checks import AlertSeen, AlertWatcher, TriageResult, runbook_file
from gameday.prom import PromClient
from gameday.scenarios import SCENARIOS, Scenario, get_scenario
from gameday.verdict import check_alerts, check_triage, gateway_statuses, parse_access_log


def _watcher(*alerts: tuple[str, str, float | None, str]) -> AlertWatcher:
    watcher = AlertWatcher(PromClient("http://127.0.0.1:9"), start_ts=0.0)
    for name, instance, firing_s, url in alerts:
        watcher.seen[(name, instance)] = AlertSeen(
            name, instance, {"alertname": name}, {"runbook_url": url}, first_pending_s=1.0, first_firing_s=firing_s)
    return watcher


def test_runbook_file_resolves_last_segment(tmp_path):
    (tmp_path / "runbooks").mkdir()
    (tmp_path / "runbooks" / "LLMEngineDown.md").write_text("# x\n")
    base = "https://github.com/llmsre/llmsre/blob/main/runbooks/"
    assert runbook_file(base + "LLMEngineDown.md", tmp_path) == tmp_path / "runbooks" / "LLMEngineDown.md"
    assert runbook_file(base + "LLMEngineDown", tmp_path) == tmp_path / "runbooks" / "LLMEngineDown.md"
    assert runbook_file(base + "LLMEngineDown.md#diagnosis", tmp_path) is not None
    assert runbook_file(base + "LLMNoSuchAlert.md", tmp_path) is None
    assert runbook_file("", tmp_path) is None


def test_check_alerts_expected_missing_unexpected_and_bad_runbook():
    scenario = Scenario(name="t", summary="", expected_alerts=[["LLMKVCacheNearlyFull"], ["LLMPreemptionsHigh"]])
    good = "https://x/runbooks/LLMKVCacheNearlyFull.md"
    watcher = _watcher(("LLMKVCacheNearlyFull", "a:1", 9.0, good),
                       ("LLMPreemptionsHigh", "a:1", None, "https://x/runbooks/LLMPreemptionsHigh.md"),
                       ("LLMQueueBacklog", "a:1", 12.5, "https://x/runbooks/LLMQueueBacklog.md"))
    assert check_alerts(scenario, watcher) == [
        "alert LLMPreemptionsHigh never fired (pending only: ['LLMPreemptionsHigh'])",
        "unexpected alert fired: LLMQueueBacklog on a:1 at +12.5s",
    ]


def test_check_alerts_a_true_co_symptom_still_fails_check_c():
    """kv-pressure is tuned so that its queue stays short: a TTFT SLO burn there is a failure, not a note."""
    scenario = get_scenario("kv-pressure")
    watcher = _watcher(("LLMKVCacheNearlyFull", "a:1", 9.0, "https://x/runbooks/LLMKVCacheNearlyFull.md"),
                       ("LLMPreemptionsHigh", "a:1", 8.0, "https://x/runbooks/LLMPreemptionsHigh.md"),
                       ("LLMTTFTSLOBurn", "a:1", 11.0, "https://x/runbooks/LLMTTFTSLOBurn.md"))
    assert check_alerts(scenario, watcher) == ["unexpected alert fired: LLMTTFTSLOBurn on a:1 at +11.0s"]


def test_check_alerts_any_of_group_and_missing_runbook_file():
    scenario = get_scenario("gateway-timeout")
    watcher = _watcher(("LLMErrorRateHigh", "a:1", 3.0, "https://x/runbooks/LLMNoSuchRunbook.md"))
    assert check_alerts(scenario, watcher) == [
        "LLMErrorRateHigh: runbook_url https://x/runbooks/LLMNoSuchRunbook.md names no file in runbooks/"]


def test_check_triage_first_finding_and_cause():
    scenario = get_scenario("dynamic-prefix")
    ok = TriageResult(1, {"status": "problems", "findings": [{"id": "cache-miss", "cause": "dynamic-prefix"}]}, "")
    assert check_triage(scenario, ok) == []
    wrong_cause = TriageResult(1, {"status": "problems", "findings": [{"id": "cache-miss", "cause": "eviction"}]}, "")
    assert check_triage(scenario, wrong_cause) == ["llmtriage cache-miss cause is eviction, expected dynamic-prefix"]
    second = TriageResult(1, {"status": "problems", "findings": [{"id": "kv-preemption"}, {"id": "cache-miss"}]}, "")
    assert check_triage(scenario, second) == [
        "llmtriage first finding is kv-preemption, expected cache-miss (all: ['kv-preemption', 'cache-miss'])"]


def test_check_triage_healthy_wants_nothing():
    healthy = get_scenario("healthy")
    assert check_triage(healthy, TriageResult(0, {"status": "ok", "findings": []}, "")) == []
    assert check_triage(healthy, TriageResult(1, {"status": "problems", "findings": [{"id": "queue-backlog"}]}, "")) == [
        "llmtriage should find nothing; found ['queue-backlog'] (status problems)"]
    assert check_triage(healthy, TriageResult(2, None, "llmtriage: error: nothing readable\n")) == [
        "llmtriage gave no JSON (exit 2): llmtriage: error: nothing readable"]


def test_parse_access_log_reads_upstreaminfo_lines(tmp_path):
    log = tmp_path / "access.log"
    log.write_text(
        '127.0.0.1 - - [29/Nov/2026:19:37:38 +0000] "POST /v1/chat/completions HTTP/1.1" 200 357 "-" '
        '"python-requests/2.34.2" 1302 3.488 [llm-engine] [] 127.0.0.1:56085 357 3.488 200 3f943e2816fac5f5a3b1ea95ecdd4376\n'
        '127.0.0.1 - - [29/Nov/2026:19:37:39 +0000] "POST /v1/chat/completions HTTP/1.1" 502 157 "-" "-" 1302 0.001 '
        "[llm-engine] [] 127.0.0.1:1, 127.0.0.1:2 0, 157 0.000, 0.001 502, 502 0123456789abcdef0123456789abcdef\n"
        "garbage line\n")
    first, second = parse_access_log(log)
    assert (first["status"], first["bytes"], first["request_time"], first["upstream"]) == (200, 357, 3.488, "127.0.0.1:56085")
    assert first["request"] == "POST /v1/chat/completions HTTP/1.1"
    assert first["epoch"] == 1795981058.0
    assert (second["status"], second["upstream"]) == (502, "127.0.0.1:1, 127.0.0.1:2")
    assert parse_access_log(tmp_path / "missing.log") == []


def test_gateway_statuses_count_the_generation_requests_and_the_slowest_served():
    records = [{"request": "GET /v1/models HTTP/1.1", "status": 200, "request_time": 0.002},
               {"request": "POST /v1/chat/completions HTTP/1.1", "status": 200, "request_time": 0.027},
               {"request": "POST /v1/chat/completions HTTP/1.1", "status": 504, "request_time": 0.301},
               {"request": "POST /v1/chat/completions HTTP/1.1", "status": 200, "request_time": 0.291},
               {"request": "POST /v1/chat/completions HTTP/1.1", "status": 504, "request_time": 0.300}]
    assert gateway_statuses(records, 0.3) == (
        "at the gateway (proxy_read_timeout 0.3s): 4 generation requests (200: 2, 504: 2); the slowest 200 took 0.291s")
    assert gateway_statuses(records[:1], 1.0) == "at the gateway (proxy_read_timeout 1s): 0 generation requests"


def test_scenario_table_covers_the_issue():
    names = [s.name for s in SCENARIOS]
    assert names == ["healthy", "kv-pressure", "kv-capacity-startup", "overload", "gateway-timeout", "client-abort",
                     "proxy-buffering", "dynamic-prefix", "engine-crash", "runtime-oom", "replica-down"]

