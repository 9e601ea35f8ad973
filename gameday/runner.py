"""Run one scenario end to end: bring the stack up, load it, inject faults, check, tear down."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from gameday import busy, dashboards, drill, prom, verdict
from gameday.checks import AlertWatcher, run_triage
from gameday.errors import GamedayError
from gameday.load import start_phase
from gameday.procs import http_get, wait_until
from gameday.scenarios import Scenario
from gameday.stack import (
    REPO_ROOT,
    Stack,
    new_stack,
    start_engine,
    start_gateway,
    start_prometheus_stack,
    wait_engine_exit,
    wait_engines_ready,
)

PROBE_TIMEOUT_S = 120.0  # Locust's start-up plus one cold ~1000-token prefill on a busy CPU
LOAD_GRACE_S = 60.0  # Locust's own stop plus report writing, beyond the phase's run time
# The measuring client's nice value (loadgen-agreement). With vLLM's `mp` executor, on the core its
# worker leaves, vLLM's engine core spins on the worker's shared-memory queue (vLLM's shm_broadcast
# readers busy-loop with sched_yield for 1 s after each read): ~92% of that core during the load. At
# the same priority Locust's loop ran timers 326 to 440 ms late at p99 and a third of the streams
# reached it whole at their end; at -10 (it and its session) 4.4 ms (docs/loadgen.md, "Against
# vLLM's own histograms"). The game days now run vLLM with `uni` (no spin); the priority stays.
CLIENT_NICE = -10
# Kept in series.json for each run: what the alerts read, second by second.
RECORDED_SERIES = ("up", "llm:requests_running", "llm:requests_waiting", "llm:kv_cache_usage:ratio",
                   "llm:preemptions:rate5m", "llm:requests_abort:ratio_rate5m", "llm:requests_error:ratio_rate5m",
                   "llm:prefix_cache_hit:ratio_rate5m", "llm:prefix_cache_hit:ratio_avg1h",
                   "llm:ttft_slo_errors:ratio_rate5m", "llm:ttft_slo_errors:ratio_rate1h")


@dataclass(slots=True)
class RunLog:
    """What happened during a run, for the checks and the report."""

    events: list[dict] = field(default_factory=list)
    killed_at_epoch: float | None = None
    killed_addr: str | None = None
    echo: bool = False  # the demo narrates each step as it happens

    def add(self, start_ts: float, what: str) -> None:
        t_s = round(time.monotonic() - start_ts, 1)
        self.events.append({"t_s": t_s, "at": datetime.now(UTC).isoformat(timespec="milliseconds"), "what": what})
        if self.echo:
            print(f"  [{t_s:5.1f}s] {what}", flush=True)


@dataclass(slots=True)
class ScenarioResult:
    name: str
    passed: bool
    duration_s: float
    failures: list[str]
    alerts_firing: list[str]
    first_finding: str | None
    first_cause: str | None
    report_dir: str
    notes: list[str] = field(default_factory=list)
    verdict: str = busy.PASS  # pass | fail | too-busy (every failure explained by machine load)


def _bring_up(stack: Stack, scenario: Scenario, start_ts: float, log: RunLog) -> None:
    for index in range(scenario.num_replicas):
        start_engine(stack, index, scenario.engine_flags, scenario.engine)
    if scenario.engine_starts:
        wait_engines_ready(stack, scenario.engine)
        log.add(start_ts, f"engines ready: {', '.join(stack.engine_addrs)}")
    else:
        code = wait_engine_exit(stack.engines[0])
        log.add(start_ts, f"engine-0 refused to start, exit code {code}")
    start_gateway(stack, scenario.proxy_read_timeout_s, scenario.proxy_buffering)
    log.add(start_ts, f"nginx on {stack.gateway_url}")


def _observe(stack: Stack, scenario: Scenario, start_ts: float, log: RunLog) -> AlertWatcher:
    """Exporter, Prometheus and the alert watcher. Started once Locust's calibration probe is done:
    a cold ~1000-token prefill takes seconds on a CPU, and inside the drill's one-minute windows
    that one request would breach the TTFT objective (counters already there at the first scrape
    are not counted by rate())."""
    start_prometheus_stack(stack, fake_gpu=scenario.probe_dashboards)
    log.add(start_ts, f"Prometheus on {stack.prom_url}")
    assert stack.prom is not None
    if scenario.engine_starts:
        stack.prom.wait_scraped("llm-engine", scenario.num_replicas)
    watcher = AlertWatcher(stack.prom, start_ts)
    watcher.start()
    return watcher


def _wait_probe_done(stack: Stack, proc) -> None:
    """Locust's first request is its calibration probe; nginx logs it when it completes."""
    access = stack.logs_dir / "nginx" / "access.log"
    wait_until(lambda: access.exists() and "POST /v1/" in access.read_text(errors="replace"), proc,
               PROBE_TIMEOUT_S, "Locust's calibration probe")


def _snapshot_metrics(stack: Stack, when: str) -> None:
    """engine-0's /metrics as it stands now, into metrics/engine-0-<when>.txt."""
    url = f"http://{stack.engine_addrs[0]}/metrics"
    try:
        status, body = http_get(url, timeout_s=30)
    except OSError as exc:
        raise GamedayError(f"cannot read {url} {when} the load: {exc}") from exc
    if status != 200:
        raise GamedayError(f"{url} answered {status} {when} the load")
    (stack.report_dir / "metrics").mkdir(exist_ok=True)
    (stack.report_dir / "metrics" / f"engine-0-{when}.txt").write_bytes(body)


def _run_load(stack: Stack, scenario: Scenario, start_ts: float, log: RunLog) -> AlertWatcher:
    if not scenario.phases:
        return _observe(stack, scenario, start_ts, log)
    watcher: AlertWatcher | None = None
    load_start = time.monotonic()
    pending = sorted(scenario.faults, key=lambda f: f.at_s)
    # loadgen against the engine itself, no gateway between; Prometheus only once the load is over:
    # on 2 cores its 1 s scrapes and rule evaluations starve the client and vLLM's API server
    direct = scenario.loadgen_agreement
    host = f"http://{stack.engine_addrs[0]}" if direct else stack.gateway_url
    cpus = _client_cpus(stack, scenario, start_ts, log) if direct else None
    nice = CLIENT_NICE if direct else None
    for index, phase in enumerate(scenario.phases):
        if direct:
            _snapshot_metrics(stack, "before")
        proc = start_phase(stack.sup, phase, index, host, stack.report_dir, cpus=cpus, nice=nice)
        placed = f" ({proc.placement})" if proc.placement else ""
        log.add(start_ts, f"load phase {index}: {phase.profile}, {phase.users} users, {phase.run_time_s}s{placed}")
        if watcher is None and not direct:
            _wait_probe_done(stack, proc)
            watcher = _observe(stack, scenario, start_ts, log)
            load_start = time.monotonic()  # harness faults are timed from here: Prometheus is watching
        deadline = time.monotonic() + phase.run_time_s + LOAD_GRACE_S
        while proc.alive():
            if pending and time.monotonic() - load_start >= pending[0].at_s:
                _inject(stack, pending.pop(0), start_ts, log)
            if time.monotonic() > deadline:
                proc.stop()
                raise GamedayError(f"load phase {index} ({phase.profile}) did not stop within its run time")
            time.sleep(0.2)
        log.add(start_ts, f"load phase {index} ended, locust exit code {proc.returncode}")
        if direct:
            _snapshot_metrics(stack, "after")
    return watcher or _observe(stack, scenario, start_ts, log)


def _client_cpus(stack: Stack, scenario: Scenario, start_ts: float, log: RunLog) -> frozenset[int] | None:
    """vLLM: the client off the cores vLLM's model runner is bound to (`taskset -c` does the same by
    hand); None (wherever the OS puts it) for other engines or when no core is left."""
    if scenario.engine != "vllm":
        return None
    from gameday.vllm import client_cpus, worker_cpus

    cpus = client_cpus(stack.engines[0])
    worker = ",".join(map(str, sorted(worker_cpus(stack.engines[0]))))
    log.add(start_ts, f"vLLM's model runner may run on CPUs {worker}" + ("; no CPU is free of it" if cpus is None else ""))
    return cpus


def _inject(stack: Stack, fault, start_ts: float, log: RunLog) -> None:
    if fault.kind not in ("kill-replica", "kill-engine-core"):
        raise GamedayError(f"unknown fault kind {fault.kind!r}")
    proc = stack.engines[fault.replica]
    if fault.kind == "kill-engine-core":  # vLLM: the engine core process alone; its API server exits
        from gameday.vllm import kill_engine_core

        pid = kill_engine_core(proc)
        log.add(start_ts, f"SIGKILL VLLM::EngineCore (pid {pid}) of engine-{fault.replica}")
        return
    proc.signal(signal.SIGKILL)
    log.killed_at_epoch = time.time()
    log.killed_addr = stack.engine_addrs[fault.replica]
    log.add(start_ts, f"SIGKILL engine-{fault.replica} ({log.killed_addr})")


def run_scenario(scenario: Scenario, report_root: Path, echo: bool = False) -> ScenarioResult:
    """Run one scenario; never raises for a failed check or a harness problem (both become failures)."""
    start_ts = time.monotonic()
    start_epoch = time.time()
    report_dir = report_root / scenario.name
    stack = new_stack(report_dir)
    log = RunLog(echo=echo)
    failures: list[str] = []
    notes: list[str] = []
    watcher: AlertWatcher | None = None
    triage = None
    load: busy.MachineLoad | None = None
    runnable = busy.RunnableSampler().start()
    try:
        _bring_up(stack, scenario, start_ts, log)
        watcher = _run_load(stack, scenario, start_ts, log)
        if scenario.expected_alerts:
            watcher.wait_for(scenario.expected_alerts, scenario.alert_wait_s)
        else:
            time.sleep(scenario.settle_s)
        watcher.stop()  # one last poll from this thread alone
        watcher.poll()
        _capture_metrics(stack)
        log.add(start_ts, "alerts checked; running llmtriage")
        triage = run_triage(stack.logs_dir, stack.prom_url, report_dir, also_text=echo)
        failures += verdict.check(scenario, stack, watcher, triage, log, notes)
        load = _measure_load(stack, start_epoch, runnable.stop(), notes)
        if scenario.probe_dashboards:
            _probe_dashboards(stack, start_epoch, notes)
        _record_series(stack, start_epoch)
    except (GamedayError, OSError) as exc:
        failures.append(f"harness: {type(exc).__name__}: {exc}")
    finally:
        runnable.stop()
        if watcher is not None:
            watcher.stop()
        stack.close()
    outcome, failures = busy.judge(failures, load, drill.target_down_alerts(drill.shipped_rule_files(REPO_ROOT)))
    result = ScenarioResult(
        name=scenario.name, passed=not failures, verdict=outcome, duration_s=round(time.monotonic() - start_ts, 1),
        failures=failures, alerts_firing=sorted(watcher.firing_names()) if watcher else [],
        first_finding=(triage.first or {}).get("id") if triage else None,
        first_cause=(triage.first or {}).get("cause") if triage else None,
        report_dir=str(report_dir), notes=notes)
    _write_report(report_dir, result, watcher, log)
    return result


def _measure_load(stack: Stack, start_epoch: float, runnable_per_core: float | None,
                  notes: list[str]) -> busy.MachineLoad | None:
    """Scrape and rule-evaluation health of the run (see gameday.busy), kept in the notes."""
    assert stack.prom is not None
    try:
        load = busy.measure(stack.prom, time.time() - start_epoch,
                            drill.parse_duration_ms(prom.SCRAPE_TIMEOUT) / 1000,
                            drill.parse_duration_ms(prom.SCRAPE_INTERVAL) / 1000)
    except (GamedayError, OSError, ValueError) as exc:
        notes.append(f"machine load not measured: {exc}")
        return None
    load.runnable_per_core = runnable_per_core
    notes.append(load.summary())
    notes.extend(load.evidence())
    return load


def _capture_metrics(stack: Stack) -> None:
    """Each live engine's /metrics as it stands at the end (metrics/engine-N.txt, beside logs/:
    llmtriage reads exposition snapshots, and the run's evidence is Prometheus's, not these)."""
    for index, (proc, addr) in enumerate(zip(stack.engines, stack.engine_addrs, strict=True)):
        if not proc.alive():
            continue
        try:
            status, body = http_get(f"http://{addr}/metrics", timeout_s=10)
        except OSError:
            continue
        if status == 200:
            (stack.report_dir / "metrics").mkdir(exist_ok=True)
            (stack.report_dir / "metrics" / f"engine-{index}.txt").write_bytes(body)


def _probe_dashboards(stack: Stack, start_epoch: float, notes: list[str]) -> None:
    queries = dashboards.panel_queries(REPO_ROOT / "dashboards")
    assert stack.prom is not None
    results = dashboards.probe(stack.prom, queries, start_epoch, time.time())
    (stack.report_dir / "dashboards.json").write_text(json.dumps(results, indent=2) + "\n")
    notes.append(f"dashboard panel queries with data: {sum(results.values())}/{len(results)}")


def _record_series(stack: Stack, start_epoch: float) -> None:
    assert stack.prom is not None
    out: dict[str, dict[str, list]] = {}
    for expr in RECORDED_SERIES:
        rows = stack.prom.query_range(expr, start_epoch, time.time(), step_s=1.0)
        out[expr] = {",".join(f"{k}={v}" for k, v in sorted(r["metric"].items()) if k != "__name__"):
                     [[round(float(t) - start_epoch, 1), v] for t, v in r["values"]] for r in rows}
    (stack.report_dir / "series.json").write_text(json.dumps(out) + "\n")


def _write_report(report_dir: Path, result: ScenarioResult, watcher: AlertWatcher | None, log: RunLog) -> None:
    alerts = watcher.to_json() if watcher else []
    (report_dir / "alerts.json").write_text(json.dumps(alerts, indent=2) + "\n")
    doc = {**asdict(result), "timeline": log.events, "prometheus_poll_errors": watcher.errors if watcher else []}
    (report_dir / "result.json").write_text(json.dumps(doc, indent=2) + "\n")
