"""The verdict of one scenario: every expectation of its table row, as failure messages."""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime
from pathlib import Path

from gameday import agreement
from gameday.checks import AlertWatcher, TriageResult, runbook_file
from gameday.load import read_summary as load_summary
from gameday.nginx import DEFAULT_READ_TIMEOUT_S
from gameday.scenarios import Scenario
from gameday.stack import Stack

# ingress-nginx upstreaminfo, as written by gameday.nginx
_ACCESS = re.compile(
    r'^\S+ - \S+ \[(?P<time>[^\]]+)\] "(?P<request>[^"]*)" (?P<status>\d{3}) (?P<bytes>\d+) "[^"]*" "[^"]*" '
    r"\d+ (?P<request_time>[\d.]+) \[[^\]]*\] \[[^\]]*\] (?P<upstream>[^\s,]+(?:, [^\s,]+)*) ")


def check(scenario: Scenario, stack: Stack, watcher: AlertWatcher, triage: TriageResult,
          log, notes: list[str]) -> list[str]:
    failures = check_alerts(scenario, watcher)
    failures += check_triage(scenario, triage)
    if any(f.kind == "kill-replica" for f in scenario.faults):
        failures += check_replica_down(stack, watcher, log, notes)
    if scenario.loadgen_agreement:
        failures += check_loadgen_agreement(stack, notes)
    if scenario.proxy_read_timeout_s < DEFAULT_READ_TIMEOUT_S:
        notes.append(gateway_statuses(parse_access_log(stack.logs_dir / "nginx" / "access.log"),
                                      scenario.proxy_read_timeout_s))
    if scenario.min_client_ttft_ratio is not None:
        histogram = "vllm:time_to_first_token_seconds" if scenario.engine == "vllm" else "llm_time_to_first_token_seconds"
        failures += check_client_ttft(scenario.min_client_ttft_ratio, stack, notes, histogram)
    return failures


def _engine_mean(stack: Stack, histogram: str) -> float | None:
    """Mean of an engine histogram over Prometheus's whole life (the warm-up before it is left out)."""
    assert stack.prom is not None
    rows = stack.prom.query(f"sum(increase({histogram}_sum[1h])) / sum(increase({histogram}_count[1h]))")
    return float(rows[0]["value"][1]) if rows else None


def check_client_ttft(min_ratio: float, stack: Stack, notes: list[str],
                      histogram: str = "llm_time_to_first_token_seconds") -> list[str]:
    """Behind a buffering gateway the client sees its first token far later than the engine made it."""
    summaries = [load_summary(d) for d in sorted((stack.report_dir / "load").glob("*"))]
    summary = next((s for s in summaries if s and (s.get("ttft_s") or {}).get("p50") is not None), None)
    engine_ttft = _engine_mean(stack, histogram)
    if summary is None or not engine_ttft:
        return ["cannot compare TTFT: no client TTFT in the loadgen summary or no engine TTFT in Prometheus"]
    client_ttft = summary["ttft_s"]["p50"]
    ratio = client_ttft / engine_ttft
    notes.append(f"TTFT: client p50 {client_ttft:.3f}s vs engine mean {engine_ttft:.3f}s ({ratio:.1f}x); "
                 f"client e2e p50 {summary['e2e_s']['p50']:.3f}s, ITL p50 {summary['itl_s']['p50'] * 1000:.2f} ms")
    if ratio < min_ratio:
        return [f"client TTFT p50 {client_ttft:.3f}s is only {ratio:.1f}x the engine's mean {engine_ttft:.3f}s "
                f"(expected >= {min_ratio:g}x behind a buffering gateway)"]
    return []


def check_loadgen_agreement(stack: Stack, notes: list[str]) -> list[str]:
    """loadgen's p50s in the engine's median buckets, its usage tokens equal to the engine's count
    (gameday.agreement); the table goes to agreement.md and the notes."""
    metrics = stack.report_dir / "metrics"
    load_dirs = sorted((stack.report_dir / "load").glob("0-*"))
    summary = load_summary(load_dirs[0]) if load_dirs else None
    try:
        before = (metrics / "engine-0-before.txt").read_text()
        after = (metrics / "engine-0-after.txt").read_text()
    except OSError as exc:
        return [f"loadgen agreement: the engine's /metrics was not read before and after the load: {exc}"]
    if summary is None:
        return ["loadgen agreement: no loadgen summary for the load phase"]
    try:
        result = agreement.compare(before, after, summary)
    except agreement.ExpositionError as exc:
        return [f"loadgen agreement: {exc}"]
    agreement.write(result, stack.report_dir)
    for row in result.rows:
        offset = row.mean_offset_s
        notes.append(f"{row.metric}: vLLM p50 in {agreement.fmt_bucket(row.bucket)}"
                     f"{agreement.fmt_outside(row.outside_s)}, loadgen p50 "
                     f"{agreement.fmt_ms(row.loadgen_p50_s)} ({'agrees' if row.agrees else 'DISAGREES'}); "
                     f"samples {row.engine_count}/{row.loadgen_count}; mean offset "
                     f"{'-' if offset is None else f'{offset * 1000:+.2f} ms'}")
    notes.append(f"output tokens: vLLM {result.engine_output_tokens}, loadgen usage {result.loadgen_output_tokens} "
                 f"over {result.engine_requests}/{result.loadgen_requests} requests")
    return result.failures


def check_alerts(scenario: Scenario, watcher: AlertWatcher) -> list[str]:
    """(a) each expected alert fired, with a runbook that resolves; (c) nothing else fired."""
    failures = []
    firing = watcher.firing()
    names = {a.name for a in firing}
    for group in scenario.expected_alerts:
        if not names.intersection(group):
            seen = sorted({a.name for a in watcher.seen.values()} - names)
            failures.append(f"alert {' or '.join(group)} never fired (pending only: {seen or 'none'})")
    expected = {name for group in scenario.expected_alerts for name in group}
    for alert in firing:
        if alert.name not in expected:
            failures.append(f"unexpected alert fired: {alert.name} on {alert.instance or '-'} at +{alert.first_firing_s}s")
            continue
        url = alert.annotations.get("runbook_url", "")
        if not url:
            failures.append(f"{alert.name}: no runbook_url annotation")
        elif runbook_file(url) is None:
            failures.append(f"{alert.name}: runbook_url {url} names no file in runbooks/")
    return failures


def check_triage(scenario: Scenario, triage: TriageResult) -> list[str]:
    """(b) llmtriage names the expected finding first (and its cause), or nothing for a healthy run."""
    if triage.doc is None:
        return [f"llmtriage gave no JSON (exit {triage.exit_code}): {triage.stderr.strip()[-300:]}"]
    ids = triage.finding_ids
    if scenario.expected_finding is None:
        if ids or triage.doc.get("status") != "ok":
            return [f"llmtriage should find nothing; found {ids} (status {triage.doc.get('status')})"]
        return []
    if not ids:
        return [f"llmtriage found nothing; expected {scenario.expected_finding} first"]
    first = triage.first or {}
    failures = []
    if ids[0] != scenario.expected_finding:
        failures.append(f"llmtriage first finding is {ids[0]}, expected {scenario.expected_finding} (all: {ids})")
    elif scenario.expected_cause and first.get("cause") != scenario.expected_cause:
        failures.append(f"llmtriage {ids[0]} cause is {first.get('cause')}, expected {scenario.expected_cause}")
    return failures


def parse_access_log(path: Path) -> list[dict]:
    """Access-log records: epoch time, status, request_time, upstream address."""
    records = []
    if not path.exists():
        return records
    for line in path.read_text(errors="replace").splitlines():
        match = _ACCESS.match(line)
        if match is None:
            continue
        ts = datetime.strptime(match["time"], "%d/%b/%Y:%H:%M:%S %z").timestamp()
        records.append({"epoch": ts, "request": match["request"], "status": int(match["status"]), "upstream": match["upstream"],
                        "request_time": float(match["request_time"]), "bytes": int(match["bytes"])})
    return records


def gateway_statuses(records: list[dict], read_timeout_s: float) -> str:
    """What a short proxy_read_timeout did to the generation requests (POSTs): how many nginx answered with
    each status, and the slowest that got through. Where the timeout cuts too few for the abort ratio's
    threshold, this note says why the alert did not fire."""
    posts = [r for r in records if r["request"].startswith("POST ")]
    counts = ", ".join(f"{status}: {num}" for status, num in sorted(Counter(r["status"] for r in posts).items()))
    served = [r["request_time"] for r in posts if r["status"] == 200]
    slowest = f"; the slowest 200 took {max(served):.3f}s" if served else ""
    return (f"at the gateway (proxy_read_timeout {read_timeout_s:g}s): {len(posts)} generation requests"
            f"{f' ({counts})' if counts else ''}{slowest}")


def check_replica_down(stack: Stack, watcher: AlertWatcher, log, notes: list[str]) -> list[str]:
    """LLMEngineDown only for the killed replica, and the survivor kept answering after the kill."""
    if log.killed_addr is None or log.killed_at_epoch is None:
        return ["the replica kill was never injected (load ended first?)"]
    failures = []
    down = {a.instance for a in watcher.firing() if a.name == "LLMEngineDown"}
    if down and down != {log.killed_addr}:
        failures.append(f"LLMEngineDown fired for {sorted(down)}, expected only {log.killed_addr}")
    survivor = [addr for addr in stack.engine_addrs if addr != log.killed_addr]
    after = [r for r in parse_access_log(stack.logs_dir / "nginx" / "access.log")
             if r["epoch"] >= int(log.killed_at_epoch) + 1]
    served = [r for r in after if r["status"] == 200 and r["upstream"].split(", ")[-1] in survivor]
    notes.append(f"after the kill: {len(after)} requests at the gateway, {len(served)} answered 200 by {survivor}")
    if not served:
        failures.append("traffic did not continue: no 200 from the surviving replica after the kill")
    return failures
