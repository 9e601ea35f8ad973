"""Rendering a diagnosis: the JSON document and the readable text report."""

import json

from triage.model import Finding, iso

DEFAULT_RUNBOOK_BASE = "https://github.com/llmsre/llmsre/blob/main/runbooks/"


def to_document(findings: list[Finding], runbook_base: str = DEFAULT_RUNBOOK_BASE, read: dict | None = None) -> dict:
    doc = {"status": "problems" if findings else "ok", "findings": [f.to_json(runbook_base) for f in findings]}
    if read is not None:
        doc["read"] = read
    return doc


def render_json(findings: list[Finding], runbook_base: str = DEFAULT_RUNBOOK_BASE, read: dict | None = None) -> str:
    return json.dumps(to_document(findings, runbook_base, read), indent=2)


def read_summary(files: list[str], facts, num_files: int, num_lines: int) -> dict:
    """What was read, for the JSON document: the same facts as the text report's summary."""
    return {"files": num_files, "lines": num_lines, "paths": files[:MAX_FILES_LISTED],
            "formats": {s: n for s, n in sorted(facts.sources.items(), key=lambda item: -item[1])},
            "start": iso(facts.first_ts), "end": iso(facts.last_ts), "requests": facts.num_requests,
            "error_lines": facts.num_error_lines, "http_5xx": facts.num_http_errors}


def _wrap(text: str, indent: str) -> str:
    import textwrap  # (the text report only: a hundredth of a second to import)

    return textwrap.fill(text, width=100, initial_indent=indent, subsequent_indent=indent)


def _evidence_lines(item: dict) -> list[str]:
    mark = "*" if item["decisive"] else "-"
    where = f"{item['file']}:{item['line']}" if item["line"] is not None else item["file"]
    ts = f" [{item['ts']}]" if item["ts"] else ""
    repeat = ""
    if item["count"] > 1:
        last = item["last"]
        repeat = f" (x{item['count']}, last at line {last['line']}{' ' + last['ts'] if last['ts'] else ''})"
    text = item["text"] if len(item["text"]) <= 240 else item["text"][:237] + "..."
    return [f"    {mark} {where}{ts}{repeat}", f"        {text}"]


# Format families as users know them (the event sources of the parsers).
FORMAT_NAMES = {
    "engine-json": "llmserve JSON log", "vllm": "vLLM text log", "tgi": "TGI log", "sglang": "SGLang log",
    "lmdeploy": "LMDeploy log",
    "ollama": "Ollama log", "triton": "Triton/glog log", "syslog": "syslog/journald", "kernel": "kernel log (dmesg)",
    "nginx-access": "nginx access log", "nginx-error": "nginx error log", "envoy": "Envoy access log",
    "alb": "AWS ALB log", "haproxy": "HAProxy log", "uvicorn": "uvicorn access log", "text": "plain text",
    "traefik": "Traefik access log", "caddy": "Caddy access log", "kong": "Kong log plugin entries",
    "client": "client log", "loadgen": "loadgen client log", "nvidia-smi": "nvidia-smi output",
    "prometheus": "Prometheus samples",
}
MAX_FILES_LISTED = 8


def summary_lines(files: list[str], facts, num_files: int, num_lines: int) -> list[str]:
    """What was read, for a report with nothing to say: files, formats, time span, requests, errors."""
    shown = ", ".join(files[:MAX_FILES_LISTED]) + (f" (+{len(files) - MAX_FILES_LISTED} more)"
                                                   if len(files) > MAX_FILES_LISTED else "")
    out = [f"  files: {shown}" if files else f"  files: {num_files}"]
    sources = sorted(facts.sources.items(), key=lambda item: -item[1])
    known = [f"{FORMAT_NAMES.get(s, s)} ({n} lines of interest)" for s, n in sources if s != "text"]
    out.append("  formats recognised: " + (", ".join(known) if known else "none (plain text only)"))
    if facts.first_ts is not None and facts.last_ts is not None:
        span = (facts.last_ts - facts.first_ts).total_seconds()
        out.append(f"  time span: {iso(facts.first_ts)} .. {iso(facts.last_ts)} ({_duration(span)})")
    else:
        out.append("  time span: no timestamps read")
    out.append(f"  requests: {facts.num_requests} seen (gateway {facts.num_gateway_requests}, "
               f"engine {facts.num_engine_requests})")
    out.append(f"  errors: {facts.num_error_lines} error lines, {facts.num_http_errors} HTTP 5xx responses")
    return out


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def render_text(findings: list[Finding], runbook_base: str = DEFAULT_RUNBOOK_BASE,
                num_files: int = 0, num_lines: int = 0, summary: list[str] | None = None) -> str:
    """The readable report. With no finding of medium or high confidence it says so, then what was
    read (summary), then the low-confidence hints if any."""
    quiet = all(f.confidence.value == "low" for f in findings)
    out: list[str] = []
    if quiet:
        out.append(f"No problems found ({num_files} files, {num_lines} lines read).")
        out.extend(summary or ())
        if not findings:
            return "\n".join(out) + "\n"
        out += ["", f"{len(findings)} low-confidence hint(s), not findings:", ""]
    else:
        out += [f"{len(findings)} finding(s), most likely root cause first "
                f"({num_files} files, {num_lines} lines read).", ""]
    doc = to_document(findings, runbook_base)
    for i, f in enumerate(doc["findings"], start=1):
        cause = f" (cause: {f['cause']})" if f["cause"] else ""
        out.append(f"{i}. {f['id']}{cause}: {f['title']}")
        out.append(f"   confidence {f['confidence']}, severity {f['severity']}")
        window = f["window"]
        if window["start"]:
            out.append(f"   window: {window['start']} .. {window['end']}")
        affected = f["affected_requests"]
        if affected["count"]:
            ids = ", ".join(affected["ids"][:10])
            more = " ..." if affected["count"] > 10 else ""
            out.append(f"   affected requests: {affected['count']}" + (f" ({ids}{more})" if ids else ""))
        out.append(_wrap(f["explanation"], "   "))
        out.append("   evidence (* decisive):")
        for item in f["evidence"]:
            out.extend(_evidence_lines(item))
        if f["counter_evidence"]:
            out.append("   against:")
            out.extend(_wrap(c, "    - ") for c in f["counter_evidence"])
        out.append("   next steps:")
        out.extend(f"    - {step}" for step in f["next_steps"])
        out.append(f"   runbook: {f['runbook']}")
        out.append("")
    return "\n".join(out)
