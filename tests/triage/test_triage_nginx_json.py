"""nginx JSON access logs (log_format ... escape=json) read as the combined format's lines: the same
statuses, timings and upstreams under the variables' own names."""

import json

import pytest

from triage.parsers import FileParser

ROWS = [  # (status, request_time, upstream_response_time)
    ("200", "12.402", "12.399"), ("504", "60.001", "60.000"), ("504", "60.002", "60.001")]


def _local(i: int) -> dict:
    status, rt, urt = ROWS[i]
    return {"time_local": f"09/May/2025:10:1{i}:03 +0000", "remote_addr": "10.0.0.7",
            "request": "POST /v1/chat/completions HTTP/1.1", "status": status, "body_bytes_sent": "562",
            "request_time": rt, "upstream_response_time": urt, "upstream_addr": "10.0.0.12:8000",
            "http_user_agent": "OpenAI/Python 1.30.1"}


def _iso(i: int) -> dict:  # numbers unquoted, method and uri apart, ISO time
    status, rt, urt = ROWS[i]
    return {"time_iso8601": f"2025-05-09T10:1{i}:03+00:00", "remote_addr": "10.0.0.7", "request_method": "POST",
            "request_uri": "/v1/chat/completions", "status": int(status), "request_time": float(rt),
            "upstream_response_time": urt, "upstream_addr": "10.0.0.11:8000, 10.0.0.12:8000"}


@pytest.mark.parametrize("row", [_local, _iso])
def test_nginx_json_access_504s_are_the_gateway_timeout(row, tmp_path, diagnose_json):
    (tmp_path / "access.log").write_text("".join(json.dumps(row(i)) + "\n" for i in range(3)))
    code, doc, err = diagnose_json(tmp_path)
    assert code == 1, err
    first = doc["findings"][0]
    assert first["id"] == "stream-cut-gateway-timeout" and first["confidence"] == "high"
    assert first["evidence"][0]["count"] == 2 and first["evidence"][0]["ts"].startswith("2025-05-09T10:11:03")
    assert doc["read"]["http_5xx"] == 2 and doc["read"]["requests"] == 3


def test_nginx_json_fields():
    ev = FileParser("access.log").parse(1, json.dumps(_iso(1)))[0]
    assert (ev.kind, ev.source) == ("http.access", "nginx-access")
    f = ev.fields
    assert (f["status"], f["duration_s"], f["upstream_s"], f["upstream_addr"], f["method"], f["path"], f["cut"]) == (
        504, 60.001, 60.0, "10.0.0.12:8000", "POST", "/v1/chat/completions", "timeout")


@pytest.mark.parametrize("obj", [
    {"status": "ok", "request_time": 1.2},  # not an HTTP status
    {"status": 504, "message": "an app's own log line"},  # no nginx timing
    {"status": 700, "request_time": "0.1"},
])
def test_other_json_with_a_status_is_not_an_access_line(obj):
    assert all(e.kind != "http.access" for e in FileParser("app.log").parse(1, json.dumps(obj)))
