"""Was the machine too busy to judge? Scrape and rule-evaluation health of one game day.

A drill runs at a 1 s scrape and evaluation interval. On a loaded machine a scrape can run into
its timeout (`up` 0 for a target that is alive), come seconds late, or Prometheus can skip rule
evaluations (`prometheus_rule_group_iterations_missed_total`). Then an alert that fired or stayed
silent says more about the machine than about the rules. This module measures that from
Prometheus itself (raw `up` and `scrape_duration_seconds` samples, Prometheus's own /metrics) and
sorts a run's failures into those the load explains and those it does not: a run whose every
failure is explained is "too busy to judge", not "the alert logic is wrong". It also samples the
machine's runnable tasks (/proc/stat `procs_running`) through the run: with more of them than the
cores can run, the engine itself is slow, and latency alerts (TTFT, queue) tell of the machine.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from gameday.errors import GamedayError
from gameday.procs import http_get
from gameday.prom import PromClient

PASS, FAIL, TOO_BUSY = "pass", "fail", "too-busy"
TIMEOUT_SHARE = 0.9  # a failed scrape that lasted 90% of the timeout or more ran into it
LATE_FACTOR = 2.0  # a scrape more than two intervals after the previous one came late
# More runnable tasks per usable core than this, on average over the run: every process (the
# engine, Locust, Prometheus) got at most two thirds of a core, so latency alerts read the machine.
OVERSUBSCRIBED = 1.5

# The failure messages of gameday.verdict that machine load can explain.
_UNEXPECTED = re.compile(r"^unexpected alert fired: (?P<name>\S+) on (?P<instance>\S+) at ")
_NEVER = re.compile(r"^alert (?P<names>.+) never fired ")
# gameday.agreement: a latency p50 outside the engine's median bucket
_DISAGREES = re.compile(r"^(TTFT|ITL|TPOT|E2E): loadgen p50 .* is not in the bucket ")
_DOWN_FOR = re.compile(r"^LLMEngineDown fired for \[(?P<instances>[^\]]*)\], expected only (?P<killed>\S+)$")


@dataclass(slots=True)
class TargetScrapes:
    """The scrapes of one target over the run."""

    job: str
    instance: str
    scrapes: int = 0
    failed: int = 0
    timed_out: int = 0  # failed after running into the scrape timeout: the target was too slow to answer
    late: int = 0  # came more than LATE_FACTOR intervals after the previous scrape: Prometheus was starved
    slowest_s: float = 0.0


@dataclass(slots=True)
class MachineLoad:
    timeout_s: float
    interval_s: float
    targets: list[TargetScrapes] = field(default_factory=list)
    rule_iterations: int = 0
    missed_iterations: int = 0  # rule group evaluations skipped because the previous one overran
    rule_failures: int = 0  # evaluations that failed: a fault of the rules, never of the machine
    runnable_per_core: float | None = None  # mean runnable tasks per usable core over the run

    def timed_out(self, instance: str) -> int:
        return sum(t.timed_out for t in self.targets if t.instance == instance)

    @property
    def oversubscribed(self) -> bool:
        return self.runnable_per_core is not None and self.runnable_per_core > OVERSUBSCRIBED

    @property
    def starved(self) -> bool:
        """Prometheus lost evaluations or scrapes, or the CPUs were oversubscribed: any alert's timing may be off."""
        return bool(self.missed_iterations or any(t.late or t.timed_out for t in self.targets) or self.oversubscribed)

    def starved_because(self) -> str:
        why = []
        if self.missed_iterations:
            why.append(f"{self.missed_iterations} rule evaluations missed")
        late = sum(t.late + t.timed_out for t in self.targets)
        if late:
            why.append(f"{late} scrapes late or timed out")
        if self.oversubscribed:
            why.append(f"{self.runnable_per_core:.1f} runnable tasks per core")
        return "Prometheus or the engine was starved: " + ", ".join(why)

    def evidence(self) -> list[str]:
        """What the load did, one line per fact worth reading (nothing for a quiet run)."""
        lines = []
        for t in self.targets:
            if t.timed_out or t.late:
                lines.append(f"scrapes of {t.job} {t.instance}: {t.timed_out} of {t.scrapes} ran into the "
                             f"{self.timeout_s:g}s timeout, {t.late} came late (more than "
                             f"{LATE_FACTOR * self.interval_s:g}s after the previous), slowest {t.slowest_s:.2f}s")
        if self.missed_iterations:
            lines.append(f"Prometheus missed {self.missed_iterations} of {self.rule_iterations} rule group "
                         "evaluations (prometheus_rule_group_iterations_missed_total)")
        if self.oversubscribed:
            lines.append(f"the CPUs were oversubscribed: {self.runnable_per_core:.1f} runnable tasks per usable core "
                         f"on average (more than {OVERSUBSCRIBED:g}), so the engine ran slower than it can")
        if self.rule_failures:
            lines.append(f"{self.rule_failures} rule evaluations failed (prometheus_rule_evaluation_failures_total): "
                         "a fault of the rules")
        return lines

    def summary(self) -> str:
        scrapes = sum(t.scrapes for t in self.targets)
        failed = sum(t.failed for t in self.targets)
        slowest = max((t.slowest_s for t in self.targets), default=0.0)
        runnable = "" if self.runnable_per_core is None else f"; {self.runnable_per_core:.1f} runnable tasks per core"
        return (f"machine load: {scrapes} scrapes, {failed} failed "
                f"({sum(t.timed_out for t in self.targets)} timed out), slowest {slowest:.2f}s of a "
                f"{self.timeout_s:g}s timeout; rule evaluations missed {self.missed_iterations} "
                f"of {self.rule_iterations}{runnable}")


def procs_running(stat_text: str) -> int | None:
    """The `procs_running` count of a /proc/stat text."""
    match = re.search(r"^procs_running (\d+)$", stat_text, re.M)
    return int(match.group(1)) if match else None


@dataclass(slots=True)
class RunnableSampler:
    """Samples /proc/stat's runnable tasks every interval_s in a thread (the sampler itself left out)."""

    interval_s: float = 1.0
    samples: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> RunnableSampler:
        self._thread = threading.Thread(target=self._run, name="runnable-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                with open("/proc/stat", encoding="ascii") as f:
                    count = procs_running(f.read())
            except OSError:
                return  # not Linux: no sample, no claim
            if count is not None:
                self.samples.append(max(0, count - 1))

    def stop(self) -> float | None:
        """Mean runnable tasks per usable core, or None without samples."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not self.samples:
            return None
        return sum(self.samples) / len(self.samples) / len(os.sched_getaffinity(0))


def summarize_target(job: str, instance: str, up: list[tuple[float, float]], durations: list[tuple[float, float]],
                     timeout_s: float, interval_s: float) -> TargetScrapes:
    """One target's scrapes from raw (timestamp, value) samples of `up` and `scrape_duration_seconds`."""
    duration_at = dict(durations)
    out = TargetScrapes(job, instance, scrapes=len(up))
    previous = None
    for ts, value in sorted(up):
        took = duration_at.get(ts, 0.0)
        out.slowest_s = max(out.slowest_s, took)
        if value == 0:
            out.failed += 1
            if took >= TIMEOUT_SHARE * timeout_s:
                out.timed_out += 1
        if previous is not None and ts - previous > LATE_FACTOR * interval_s:
            out.late += 1
        previous = ts
    return out


def parse_rule_metrics(text: str) -> tuple[int, int, int]:
    """(iterations, missed iterations, failed evaluations) summed over every rule group."""
    sums = {"prometheus_rule_group_iterations_total": 0.0, "prometheus_rule_group_iterations_missed_total": 0.0,
            "prometheus_rule_evaluation_failures_total": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += sample.value
    return (int(sums["prometheus_rule_group_iterations_total"]),
            int(sums["prometheus_rule_group_iterations_missed_total"]),
            int(sums["prometheus_rule_evaluation_failures_total"]))


def _samples(rows: list[dict]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    return {(r["metric"].get("job", ""), r["metric"].get("instance", "")):
            [(float(t), float(v)) for t, v in r["values"]] for r in rows}


def measure(prom: PromClient, window_s: float, timeout_s: float, interval_s: float) -> MachineLoad:
    """Scrape and rule-evaluation health over the last window_s seconds (the run: a fresh Prometheus)."""
    window = f"[{max(1, round(window_s))}s]"
    up = _samples(prom.query("up" + window))
    durations = _samples(prom.query("scrape_duration_seconds" + window))
    load = MachineLoad(timeout_s=timeout_s, interval_s=interval_s)
    load.targets = [summarize_target(job, instance, samples, durations.get((job, instance), []), timeout_s, interval_s)
                    for (job, instance), samples in sorted(up.items())]
    status, body = http_get(prom.base_url + "/metrics", timeout_s=10)
    if status != 200:
        raise GamedayError(f"Prometheus /metrics: HTTP {status}")
    load.rule_iterations, load.missed_iterations, load.rule_failures = parse_rule_metrics(body.decode(errors="replace"))
    return load


def _explained(failure: str, load: MachineLoad, down_alerts: set[str]) -> str | None:
    """Why the load explains this failure, or None when it does not."""
    if match := _UNEXPECTED.match(failure):
        if match["name"] in down_alerts:
            count = load.timed_out(match["instance"])
            return f"{count} scrapes of {match['instance']} timed out" if count else None
        return load.starved_because() if load.starved else None
    if _NEVER.match(failure):
        return load.starved_because() if load.starved else None
    if _DISAGREES.match(failure):  # the client timed its own waits for a CPU
        if "the client fell behind" in failure:
            return "loadgen's own event loop fell behind"
        return f"{load.runnable_per_core:.1f} runnable tasks per core" if load.oversubscribed else None
    if match := _DOWN_FOR.match(failure):
        extra = [i.strip().strip("'") for i in match["instances"].split(",")]
        extra = [i for i in extra if i and i != match["killed"]]
        if extra and all(load.timed_out(i) for i in extra):
            return "scrapes of " + ", ".join(f"{i} ({load.timed_out(i)})" for i in extra) + " timed out"
    return None


def judge(failures: list[str], load: MachineLoad | None, down_alerts: set[str]) -> tuple[str, list[str]]:
    """(verdict, failures): pass; too-busy when the load explains every failure (each says how);
    fail otherwise, and always when a rule evaluation failed (the rules, not the machine)."""
    if not failures:
        return PASS, []
    if load is None or load.rule_failures:
        return FAIL, failures
    reasons = [_explained(f, load, down_alerts) for f in failures]
    if all(reasons):
        return TOO_BUSY, [f"{f} (the machine was too busy to judge: {why})" for f, why in zip(failures, reasons, strict=True)]
    return FAIL, failures
