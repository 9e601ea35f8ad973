"""Rendering a diagnosis: the JSON document and the readable text report."""

import json
import textwrap

from triage.model import Finding

DEFAULT_RUNBOOK_BASE = "https://github.com/llmsre/llmsre/blob/main/runbooks/"


def to_document(findings: list[Finding], runbook_base: str = DEFAULT_RUNBOOK_BASE) -> dict:
    return {"status": "problems" if findings else "ok",
            "findings": [f.to_json(runbook_base) for f in findings]}


def render_json(findings: list[Finding], runbook_base: str = DEFAULT_RUNBOOK_BASE) -> str:
    return json.dumps(to_document(findings, runbook_base), indent=2)


def _wrap(text: str, indent: str) -> str:
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


def render_text(findings: list[Finding], runbook_base: str = DEFAULT_RUNBOOK_BASE,
                num_files: int = 0, num_lines: int = 0) -> str:
    if not findings:
        return f"No problems found ({num_files} files, {num_lines} lines read).\n"
    doc = to_document(findings, runbook_base)
    out = [f"{len(findings)} finding(s), most likely root cause first "
           f"({num_files} files, {num_lines} lines read).", ""]
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
