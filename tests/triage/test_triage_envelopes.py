"""Lines inside a log collector's envelope read as the lines themselves: docker compose's and podman-compose's
service prefix (plain and coloured), kubectl logs --timestamps, the CRI log files' stamp and stream, a stamp
and a tab (Grafana, Loki), RFC 5424 syslog, journalctl's short, short-precise and short-iso heads, a line
indented or quoted where it was pasted (Markdown), the
JSON envelopes of docker's json-file, journalctl -o json, Google Cloud Logging, Loki and CloudWatch, CRLF
line ends, gzip and rotated files, and an engine's and a gateway's lines in one file. Each breadth fixture
gives the same first finding however it is wrapped, and a healthy one stays quiet."""

import gzip
import json
from pathlib import Path

import pytest

from triage.parsers import text_logs

BREADTH = Path(__file__).parent / "fixtures" / "breadth"
CASES = ("oom-runtime/vllm-v1-oom-serving", "stream-cut-gateway-timeout/nginx-504-access-only",
         "stream-cut-gateway-timeout/nginx-timed-out-reading-upstream",
         "stream-cut-client-disconnect/nginx-499-access", "engine-crash/ollama-llama-server-terminated",
         "healthy/nginx-streaming-ok", "healthy/vllm-v1-startup-serving")

WRAPS = {
    "compose": lambda line: "vllm-1  | " + line,
    "compose-coloured": lambda line: "\x1b[36mllm-gw-1  |\x1b[0m " + line,
    "kubectl-timestamps": lambda line: "2025-05-09T10:12:03.123456789Z " + line,
    "journald": lambda line: "May 09 10:12:03 gpu-host svc[4127]: " + line,
    "journald-short-precise": lambda line: "May 09 10:12:03.123456 gpu-host svc[4127]: " + line,
    "journald-short-iso": lambda line: "2025-05-09T10:12:03+0000 gpu-host svc[4127]: " + line,
    "crlf": lambda line: line + "\r",
    "cri-log-file": lambda line: "2025-05-09T10:12:03.123456789Z stdout F " + line,  # /var/log/pods/...
    "grafana-tab": lambda line: "2025-05-09 10:12:03.123\t" + line,
    "syslog-rfc5424": lambda line: "<14>1 2025-05-09T10:12:03.123Z gpu-host vllm 4127 - - " + line,
    "podman-compose": lambda line: "[vllm] | " + line,
    "indented": lambda line: "    " + line,  # (a code block inside a Markdown list)
    "markdown-quote": lambda line: "> " + line,
    # JSON envelopes, each line a string value (Go's encoder, docker's and Loki's, writes <, > and & as \u003c ...)
    "docker-json-file": lambda line: _go_json({"log": line + "\n", "stream": "stdout",
                                                "time": "2025-05-09T10:12:03.123456789Z"}),
    "journald-json": lambda line: json.dumps({"__REALTIME_TIMESTAMP": "1746785523123456", "_SYSTEMD_UNIT": "llm.service",
                                              "MESSAGE": line}),
    "gcp-text-payload": lambda line: json.dumps({"textPayload": line, "timestamp": "2025-05-09T10:12:03.123456Z",
                                                 "severity": "INFO"}),
    "gcp-json-payload": lambda line: json.dumps({"jsonPayload": {"message": line},
                                                 "timestamp": "2025-05-09T10:12:03.123456Z"}),
    "loki-jsonl": lambda line: _go_json({"labels": {"app": "llm"}, "line": line,
                                         "timestamp": "2025-05-09T10:12:03.123456789Z"}),
    "cloudwatch": lambda line: json.dumps({"timestamp": 1746785523123, "message": line, "ingestionTime": 1746785524000}),
}


def _go_json(obj) -> str:
    return json.dumps(obj, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _write(case: Path, dest: Path, wrap) -> None:
    dest.mkdir()
    for src in case.iterdir():
        if src.name == "expected.json":
            continue
        lines = src.read_text().splitlines()
        (dest / src.name).write_text("".join(wrap(line) + "\n" for line in lines))


def _first(diagnose_json, *paths) -> tuple:
    code, doc, err = diagnose_json(*paths)
    assert "Traceback" not in err and code in (0, 1), err
    loud = [f for f in doc["findings"] if f["confidence"] in ("medium", "high")]
    return (loud[0]["id"], loud[0]["cause"]) if loud else None


def _expected(case: Path) -> tuple | None:
    want = json.loads((case / "expected.json").read_text())
    return None if want["first"] is None else (want["first"], want.get("cause"))


@pytest.mark.parametrize("wrap", sorted(WRAPS))
@pytest.mark.parametrize("name", CASES)
def test_a_wrapped_log_reads_as_the_log(name, wrap, tmp_path, diagnose_json):
    case = BREADTH / name
    _write(case, tmp_path / "logs", WRAPS[wrap])
    assert _first(diagnose_json, tmp_path / "logs") == _expected(case)


def test_wrapped_lines_keep_the_envelope_time_and_quote_the_line_whole(tmp_path, diagnose_json):
    case = BREADTH / "stream-cut-gateway-timeout/nginx-504-access-only"
    _write(case, tmp_path / "logs", WRAPS["journald"])
    code, doc, _ = diagnose_json(tmp_path / "logs")
    ev = doc["findings"][0]["evidence"][0]
    assert ev["text"].startswith("May 09 10:12:03 gpu-host svc[4127]: 10.0.0.7 - - [09/May/2025:10:13:33")
    assert ev["ts"].startswith("2025-05-09T10:13:33")  # the access line's own time, not the envelope's


@pytest.mark.parametrize("wrap", ["docker-json-file", "cloudwatch"])
def test_json_wrapped_lines_keep_their_own_time_and_quote_the_envelope_whole(wrap, tmp_path, diagnose_json):
    case = BREADTH / "stream-cut-gateway-timeout/nginx-504-access-only"
    _write(case, tmp_path / "logs", WRAPS[wrap])
    code, doc, _ = diagnose_json(tmp_path / "logs")
    ev = doc["findings"][0]["evidence"][0]
    assert ev["text"].startswith('{"') and '10.0.0.7 - - [09/May/2025:10:13:33' in ev["text"]
    assert ev["ts"].startswith("2025-05-09T10:13:33")  # the access line's own time, not the envelope's


@pytest.mark.parametrize(("envelope", "ts"), [
    ({"__REALTIME_TIMESTAMP": "1746785523123456"}, "2025-05-09T10:12:03.123456"),  # journald: microseconds
    ({"timestamp": 1746785523123}, "2025-05-09T10:12:03.123000"),  # CloudWatch: milliseconds
    ({"ts": 1746785523.5}, "2025-05-09T10:12:03.500000"),  # zap: seconds
    ({"timestamp": "2025-05-09T10:12:03.123456789Z"}, "2025-05-09T10:12:03.123456"),
    ({"time": 7}, None), ({"time": True}, None), ({"time": "soon"}, None),
])
def test_a_line_without_a_time_takes_its_json_envelope_s(envelope, ts):
    from triage.parsers import FileParser

    line = json.dumps({**envelope, "MESSAGE": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"})
    events = FileParser("engine.log").parse(10, line)
    assert events and {e.text for e in events} == {line}
    assert {e.ts.isoformat() if e.ts else None for e in events} == {ts}


def test_rotated_and_gzipped_files_and_one_mixed_file(tmp_path, diagnose_json):
    engine = (BREADTH / "oom-runtime/vllm-v1-oom-serving/engine.log").read_bytes()
    access = (BREADTH / "stream-cut-gateway-timeout/nginx-504-access-only/nginx-access.log").read_bytes()
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "engine.log.1").write_bytes(engine)
    (logs / "engine.log.2.gz").write_bytes(gzip.compress(engine))
    (logs / "all.log").write_bytes(engine + access)
    code, doc, err = diagnose_json(logs)
    assert doc["read"]["files"] == 3
    assert [f["id"] for f in doc["findings"][:2]] == ["oom-runtime", "engine-crash"]
    assert "stream-cut-gateway-timeout" in {f["id"] for f in doc["findings"]}


@pytest.mark.parametrize("line", [
    "2024-04-10T09:19:37.911937Z ERROR text_generation_launcher: Shard 0 failed to start",  # TGI's own stamp
    '  File "/usr/lib/python3/dist-packages/vllm/worker.py", line 12, in load_model',  # a traceback's frame
    "    raise RuntimeError(msg)", ">>> import vllm", "<14>1 2025-05-09T10:12:03Z host app 1 - - free text",
    "2024-04-10T09:19:37.911937Z ERROR shard-manager: text_generation_launcher: Shard complete standard error output:",
    "Mar 12 10:00:00 lb haproxy[812]: 10.0.0.7:51234 [12/Mar/2025:10:00:00.123] fe be/s1 0/0/1/-1/60001 504",
    "Mar 12 10:00:00 host systemd[1]: ollama.service: Failed with result 'oom-kill'.",  # read by split_envelope
    "INFO | not a compose prefix",
    "| GPU  Name  |",
])
def test_lines_that_are_not_in_an_envelope(line):
    assert text_logs.unwrap(line) is None


def test_unwrap_takes_the_envelope_off():
    assert text_logs.unwrap("ollama  | time=2025-02-24T11:16:31.470-08:00 level=ERROR msg=x") == (
        None, "time=2025-02-24T11:16:31.470-08:00 level=ERROR msg=x")
    ts, inner = text_logs.unwrap('2025-05-09T10:12:03Z 10.0.0.7 - - [09/May/2025:10:12:03 +0000] "GET / HTTP/1.1"')
    assert inner.startswith("10.0.0.7 - - [") and ts.year == 2025
    ts, inner = text_logs.unwrap("May 15 14:22:41 rab-wksta kernel: [65717.753784] NVRM: Xid (PCI:0000:08:00): 31")
    assert inner == "[65717.753784] NVRM: Xid (PCI:0000:08:00): 31" and ts is not None


@pytest.mark.parametrize("wrap", sorted(WRAPS))
def test_a_wrapped_traceback_keeps_its_frames(wrap, tmp_path, diagnose_json):
    """The frames of a traceback name its phase (an OOM under load_weights is at weight loading): they are
    read inside an envelope and behind PyTorch's per-rank prefix as on their own."""
    case = BREADTH / "oom-weights/vllm-tp-worker-rank-prefix"
    lines = (case / "engine.log").read_text().splitlines()
    assert all(line.startswith("[rank0]: ") for line in lines)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "engine.log").write_text("".join(WRAPS[wrap](line) + "\n" for line in lines))
    assert _first(diagnose_json, logs) == ("oom-weights", None)


HEALTHY = sorted(p.parent.name for p in (BREADTH / "healthy").glob("*/expected.json"))


@pytest.mark.parametrize("wrap", ["compose", "kubectl-timestamps", "journald-short-iso", "docker-json-file"])
@pytest.mark.parametrize("name", HEALTHY)
def test_a_wrapped_healthy_log_stays_quiet(name, wrap, tmp_path, diagnose_json):
    case = BREADTH / "healthy" / name
    logs = tmp_path / "logs"
    logs.mkdir()
    for src in case.iterdir():
        if src.name != "expected.json":
            (logs / src.name).write_text("".join(WRAPS[wrap](line) + "\n" for line in src.read_text().splitlines()))
    assert _first(diagnose_json, logs) is None

