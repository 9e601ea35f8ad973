"""Too busy to judge, or the alert logic is wrong: the verdict on hand-made scrape and rule evidence."""

import time
from pathlib import Path

import yaml

from gameday import busy, drill
from gameday.busy import MachineLoad, TargetScrapes, judge, parse_rule_metrics, summarize_target

REPO = Path(__file__).resolve().parents[2]
DOWN = {"LLMEngineDown", "LLMGPUExporterDown"}
ENGINE = "127.0.0.1:8001"
UNEXPECTED_DOWN = f"unexpected alert fired: LLMEngineDown on {ENGINE} at +19.9s"


def _load(timed_out: int = 0, late: int = 0, missed: int = 0, failures: int = 0,
          runnable: float | None = None) -> MachineLoad:
    target = TargetScrapes("llm-engine", ENGINE, scrapes=40, failed=timed_out, timed_out=timed_out, late=late,
                           slowest_s=1.0 if timed_out else 0.02)
    return MachineLoad(timeout_s=1.0, interval_s=1.0, targets=[target], rule_iterations=120,
                       missed_iterations=missed, rule_failures=failures, runnable_per_core=runnable)


def test_summarize_target_counts_timeouts_refusals_and_late_scrapes():
    up = [(100.0, 1), (101.0, 0), (102.0, 0), (105.5, 1), (106.5, 1)]
    durations = [(100.0, 0.01), (101.0, 1.0), (102.0, 0.003), (105.5, 0.2), (106.5, 0.95)]
    t = summarize_target("llm-engine", ENGINE, up, durations, timeout_s=1.0, interval_s=1.0)
    # 101: ran into the 1 s timeout; 102: refused at once (a dead process); 105.5 came 3.5 s late
    assert (t.scrapes, t.failed, t.timed_out, t.late, t.slowest_s) == (5, 2, 1, 1, 1.0)


def test_parse_rule_metrics_sums_groups():
    text = (
        "# HELP prometheus_rule_group_iterations_missed_total The total number of rule group evaluations missed.\n"
        "# TYPE prometheus_rule_group_iterations_missed_total counter\n"
        'prometheus_rule_group_iterations_missed_total{rule_group="a.yml;g1"} 2\n'
        'prometheus_rule_group_iterations_missed_total{rule_group="a.yml;g2"} 1\n'
        "# TYPE prometheus_rule_group_iterations_total counter\n"
        'prometheus_rule_group_iterations_total{rule_group="a.yml;g1"} 30\n'
        'prometheus_rule_group_iterations_total{rule_group="a.yml;g2"} 31\n'
        "# TYPE prometheus_rule_evaluation_failures_total counter\n"
        'prometheus_rule_evaluation_failures_total{rule_group="a.yml;g1"} 0\n'
        "# TYPE up_other gauge\nup_other 5\n")
    assert parse_rule_metrics(text) == (61, 3, 0)


def test_an_engine_down_from_timed_out_scrapes_is_too_busy():
    outcome, failures = judge([UNEXPECTED_DOWN], _load(timed_out=11), DOWN)
    assert outcome == busy.TOO_BUSY
    assert failures == [UNEXPECTED_DOWN + " (the machine was too busy to judge: 11 scrapes of 127.0.0.1:8001 timed out)"]


def test_an_engine_down_on_refused_scrapes_is_the_alert_logic():
    """Connection refused (a process really gone) is no load; nor is a late scrape for an up alert."""
    assert judge([UNEXPECTED_DOWN], _load(late=3, missed=2), DOWN) == (busy.FAIL, [UNEXPECTED_DOWN])
    other = "unexpected alert fired: LLMEngineDown on 127.0.0.1:9999 at +3.0s"
    assert judge([other], _load(timed_out=11), DOWN) == (busy.FAIL, [other])


def test_other_alert_failures_are_too_busy_only_when_prometheus_was_starved():
    never = "alert LLMStreamAbortsHigh or LLMErrorRateHigh never fired (pending only: none)"
    burn = "unexpected alert fired: LLMTTFTSLOBurn on 127.0.0.1:8001 at +11.0s"
    assert judge([never, burn], _load(), DOWN) == (busy.FAIL, [never, burn])
    outcome, failures = judge([never, burn], _load(missed=4), DOWN)
    assert outcome == busy.TOO_BUSY
    assert failures[0] == never + " (the machine was too busy to judge: Prometheus or the engine was starved: 4 rule evaluations missed)"


def test_one_unexplained_failure_makes_the_run_a_failure():
    triage = "llmtriage first finding is queue-backlog, expected engine-crash (all: ['queue-backlog'])"
    assert judge([UNEXPECTED_DOWN, triage], _load(timed_out=11, missed=4), DOWN) == (busy.FAIL, [UNEXPECTED_DOWN, triage])


def test_failed_rule_evaluations_are_never_the_machine():
    assert judge([UNEXPECTED_DOWN], _load(timed_out=11, failures=1), DOWN)[0] == busy.FAIL
    assert "a fault of the rules" in _load(failures=1).evidence()[0]


def test_replica_down_extra_instance_with_timeouts():
    failure = f"LLMEngineDown fired for ['127.0.0.1:7000', '{ENGINE}'], expected only 127.0.0.1:7000"
    load = _load(timed_out=12)
    load.targets.append(TargetScrapes("llm-engine", "127.0.0.1:7000", scrapes=20, failed=12))
    outcome, _ = judge([failure], load, DOWN)
    assert outcome == busy.TOO_BUSY
    assert judge([failure.replace(ENGINE, "127.0.0.1:7001")], load, DOWN)[0] == busy.FAIL


def test_no_failures_pass_and_no_measurement_fails():
    assert judge([], _load(timed_out=11), DOWN) == (busy.PASS, [])
    assert judge([UNEXPECTED_DOWN], None, DOWN) == (busy.FAIL, [UNEXPECTED_DOWN])


def test_evidence_and_summary_lines():
    load = _load(timed_out=2, late=1, missed=3)
    assert load.evidence() == [
        "scrapes of llm-engine 127.0.0.1:8001: 2 of 40 ran into the 1s timeout, 1 came late (more than 2s after "
        "the previous), slowest 1.00s",
        "Prometheus missed 3 of 120 rule group evaluations (prometheus_rule_group_iterations_missed_total)"]
    assert load.summary() == ("machine load: 40 scrapes, 2 failed (2 timed out), slowest 1.00s of a 1s timeout; "
                              "rule evaluations missed 3 of 120")
    assert _load().evidence() == []


def test_drill_target_down_alerts_keep_ten_seconds_of_for():
    """One slow scrape (up 0 for a second) must never be enough to page that a target is down."""
    sources = drill.shipped_rule_files(REPO)
    assert drill.target_down_alerts(sources) >= DOWN
    doc = yaml.safe_load((REPO / "alerts" / "alerts.rules.yml").read_text())
    rules = {r["alert"]: r for g in drill.rewrite_rules(doc)["groups"] for r in g["rules"] if "alert" in r}
    assert rules["LLMEngineDown"]["for"] == "10s"  # 1m / 60 is 1s: floored
    assert rules["LLMGPUExporterDown"]["for"] == "10s"  # 5m / 60 is 5s: floored
    assert rules["LLMKVCacheNearlyFull"]["for"] == "5s"  # not an up alert: plain scaling


def test_reads_up():
    assert drill.reads_up('up{job="llm-engine"} == 0')
    assert drill.reads_up('absent(up{job="x"})')
    assert not drill.reads_up('llm:up == 0 or x{state="up"} or setup_total > 0')


def test_oversubscribed_cpus_explain_latency_alerts_but_never_a_target_down():
    """A TTFT burn on a machine running 4.8 tasks per core is the machine's; an engine down is not."""
    burn = "unexpected alert fired: LLMTTFTSLOBurn on 127.0.0.1:8001 at +80.7s"
    never = "alert LLMPrefixCacheHitRateLow never fired (pending only: ['LLMPrefixCacheHitRateLow'])"
    assert judge([burn, never], _load(runnable=1.2), DOWN)[0] == busy.FAIL
    outcome, failures = judge([burn, never], _load(runnable=4.8), DOWN)
    assert outcome == busy.TOO_BUSY
    assert failures[0] == burn + (" (the machine was too busy to judge: Prometheus or the engine was starved: "
                                  "4.8 runnable tasks per core)")
    assert judge([UNEXPECTED_DOWN], _load(runnable=4.8), DOWN) == (busy.FAIL, [UNEXPECTED_DOWN])
    assert _load(runnable=4.8).evidence() == [
        "the CPUs were oversubscribed: 4.8 runnable tasks per usable core on average (more than 1.5), "
        "so the engine ran slower than it can"]
    assert _load(runnable=0.5).summary().endswith("; 0.5 runnable tasks per core")


def test_procs_running_and_the_sampler():
    assert busy.procs_running("cpu  1 2 3\nprocs_running 7\nprocs_blocked 0\n") == 7
    assert busy.procs_running("cpu 1 2 3\n") is None
    sampler = busy.RunnableSampler(interval_s=0.05).start()
    deadline = time.monotonic() + 5
    while not sampler.samples and time.monotonic() < deadline:
        time.sleep(0.05)
    per_core = sampler.stop()
    assert sampler.samples and per_core is not None and per_core >= 0


def test_a_loadgen_disagreement_is_too_busy_only_when_the_client_or_the_cpus_fell_behind():
    base = ("TTFT: loadgen p50 50.23 ms is not in the bucket (20, 40] ms holding the median of "
            "vllm:time_to_first_token_seconds")
    behind = base + " (loadgen's own loop ran timers 366 ms late at p99: the client fell behind)"
    assert judge([base], _load(missed=40, timed_out=3), DOWN)[0] == busy.FAIL  # Prometheus ran after the load
    assert judge([base], _load(runnable=2.1), DOWN) == (
        busy.TOO_BUSY, [base + " (the machine was too busy to judge: 2.1 runnable tasks per core)"])
    assert judge([behind], _load(), DOWN) == (
        busy.TOO_BUSY, [behind + " (the machine was too busy to judge: loadgen's own event loop fell behind)"])
    tokens = "output tokens: the engine generated 12, loadgen's usage says 11"
    assert judge([behind, tokens], _load(runnable=4.0), DOWN)[0] == busy.FAIL  # a count is never the machine's
