"""The llmtriage command in-process: JSON shape, text report, exit codes, windows, ranking, grouping."""

import json

from tests.triage.conftest import CORPUS
from triage.model import FINDING_IDS

FINDING_KEYS = {"id", "title", "severity", "confidence", "cause", "window", "affected_requests", "evidence",
                "counter_evidence", "explanation", "next_steps", "runbook"}
EVIDENCE_KEYS = {"file", "line", "ts", "text", "decisive", "signal", "count"}


def test_json_document_shape(diagnose_json):
    code, doc, _ = diagnose_json(CORPUS / "runtime-oom-engine")
    assert code == 1 and doc["status"] == "problems" and set(doc) == {"status", "findings", "read"}
    first = doc["findings"][0]
    assert set(first) == FINDING_KEYS
    assert first["id"] == "oom-runtime" and first["confidence"] == "high" and first["severity"] == "critical"
    assert first["runbook"] == "https://github.com/llmsre/llmsre/blob/main/runbooks/oom-runtime.md"
    assert first["affected_requests"]["count"] == 6
    assert first["affected_requests"]["ids"] == [f"chatcmpl-e{i}" for i in range(6)]
    assert first["window"] == {"start": "2026-11-29T19:40:07.000Z", "end": "2026-11-29T19:40:12.000Z"}
    decisive = [e for e in first["evidence"] if e["decisive"]]
    assert EVIDENCE_KEYS <= set(decisive[0])
    # Six identical engine errors are one group: count, first and last.
    assert decisive[0]["count"] == 6 and decisive[0]["line"] < decisive[0]["last"]["line"]
    assert '"event":"engine.error"' in decisive[0]["text"]
    assert first["next_steps"] and first["explanation"]


def test_healthy_exit_0_and_status_ok(diagnose_json, run_cli):
    code, doc, _ = diagnose_json(CORPUS / "healthy-engine-nginx")
    read = doc.pop("read")
    assert (code, doc) == (0, {"status": "ok", "findings": []})
    # what was read, as the text report's summary says it
    assert (read["files"], read["formats"]["engine-json"] > 0, read["error_lines"], read["http_5xx"]) == (
        sum(1 for p in (CORPUS / "healthy-engine-nginx").rglob("*") if p.is_file()), True, 0, 0)
    assert read["requests"] > 0 and read["start"] < read["end"]
    code, out, _ = run_cli("diagnose", CORPUS / "vllm-healthy" / "vllm.log")
    assert code == 0 and out.startswith("No problems found (1 files, 11 lines read).")


def test_root_cause_first(diagnose_json):
    _, doc, _ = diagnose_json(CORPUS / "vllm-runtime-oom-crash")
    assert [f["id"] for f in doc["findings"]] == ["oom-runtime", "engine-crash"]
    _, doc, _ = diagnose_json(CORPUS / "driver-mismatch-torch")
    assert [f["id"] for f in doc["findings"]] == ["driver-mismatch", "oom-runtime"]
    assert any("driver" in c for c in doc["findings"][1]["counter_evidence"])


def test_text_report(run_cli):
    code, out, _ = run_cli("diagnose", CORPUS / "nginx-one-line-timeout" / "error.log", "--runbook-base", "runbooks/")
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "1 finding(s), most likely root cause first (1 files, 1 lines read)."
    assert lines[2] == "1. stream-cut-gateway-timeout: Streams cut by a gateway timeout"
    assert lines[3] == "   confidence high, severity high"
    assert "   runbook: runbooks/stream-cut-gateway-timeout.md" in lines
    assert any(line.startswith("    * ") and "error.log:1 [2024-05-01T12:00:00.000Z]" in line for line in lines)


def test_since_until_window(diagnose_json):
    case = CORPUS / "engine-crash-engine"
    code, doc, _ = diagnose_json(case, extra=("--until", "2026-11-29T19:40:11Z"))
    assert code == 0 and doc["findings"] == []
    code, doc, _ = diagnose_json(case, extra=("--since", "2026-11-29T19:40:11Z"))
    assert doc["findings"][0]["id"] == "engine-crash"


def test_usage_errors_exit_2(run_cli, tmp_path):
    code, out, err = run_cli("diagnose", tmp_path / "missing")
    assert (code, out) == (2, "") and err.strip() == f"llmtriage: no such file or folder: {tmp_path / 'missing'}"
    code, _, err = run_cli("diagnose", CORPUS / "vllm-healthy", "--since", "yesterday")
    assert code == 2 and err.startswith("llmtriage: not a time: 'yesterday'") and "\n" == err[-1:]
    for bad in ("1e20", "nan", "", "  "):  # out of time_t's range, not a number, nothing
        code, out, err = run_cli("diagnose", CORPUS / "vllm-healthy", "--since", bad)
        assert (code, out) == (2, "") and err.startswith("llmtriage: not a time: ") and err.count("\n") == 1, bad
    code, _, err = run_cli("diagnose", CORPUS / "vllm-healthy", "--since", "2026-11-29T13:00:00Z", "--until",
                           "2026-11-29T12:00:00Z")
    assert code == 2 and err == "llmtriage: --since 2026-11-29T13:00:00Z is after --until 2026-11-29T12:00:00Z\n"
    code, _, err = run_cli("diagnose", CORPUS / "vllm-healthy", "--prometheus", "localhost:9090")
    assert code == 2 and "--prometheus needs an http(s) URL" in err
    code, _, err = run_cli("diagnose", CORPUS / "vllm-healthy", "--format", "yaml")
    assert code == 2 and err.count("\n") == 1 and "invalid choice: 'yaml'" in err


def test_unreachable_prometheus_is_a_note_not_a_failure(run_cli):
    code, out, err = run_cli("diagnose", CORPUS / "vllm-v0-preemption", "--prometheus", "http://127.0.0.1:9",
                             "--format", "json")
    assert code == 1 and json.loads(out)["findings"][0]["id"] == "kv-preemption"
    assert "llmtriage: prometheus: cannot reach http://127.0.0.1:9/api/v1/query_range" in err


def test_finding_ids_have_runbooks_and_docs():
    root = CORPUS.parents[2]
    doc = (root / "docs" / "triage.md").read_text()
    for fid in FINDING_IDS:
        text = (root / "runbooks" / f"{fid}.md").read_text()
        assert [s for s in ("## Meaning", "## Impact", "## Diagnosis", "## Mitigation") if s in text] == [
            "## Meaning", "## Impact", "## Diagnosis", "## Mitigation"], fid
        assert f"`{fid}`" in doc


def test_missing_arguments_name_the_subcommand(run_cli):
    assert run_cli() == (2, "", "llmtriage: the following arguments are required: command (see llmtriage --help)\n")
    code, _, err = run_cli("diagnose")
    assert (code, err) == (2, "llmtriage: the following arguments are required: PATH "
                              "(see llmtriage diagnose --help)\n")
