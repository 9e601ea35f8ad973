"""Cloudflare: its HTTP request records (Logpush / Logpull, dataset http_requests) read as access lines, and its
52x statuses as a client sees them.

The records use Cloudflare's field names for that dataset (as Grafana Loki's promtail Cloudflare target lists them
in its default, minimal and extended field sets, plus OriginResponseDurationMs): EdgeStartTimestamp is an integer
of nanoseconds by default (Logpush's timestamps=unixnano; unix gives seconds, rfc3339 a string)."""

import json
from datetime import UTC, datetime

import pytest

from triage.parsers import FileParser

START_NS = 1764669600_000_000_000  # 2025-12-02T10:00:00Z


def _record(i: int, status: int, origin: int, seconds: float, stamps: str = "unixnano") -> dict:
    start_ns = START_NS + i * 7_000_000_000
    end_ns = start_ns + int(seconds * 1e9)
    if stamps == "unixnano":
        start, end = start_ns, end_ns
    elif stamps == "unix":
        start, end = start_ns // 1_000_000_000, end_ns // 1_000_000_000
    else:  # rfc3339
        start, end = (datetime.fromtimestamp(t / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%SZ") for t in (start_ns, end_ns))
    return {"ClientIP": "203.0.113.9", "ClientRequestHost": "llm.example.com", "ClientRequestMethod": "POST",
            "ClientRequestURI": "/v1/chat/completions", "EdgeEndTimestamp": end, "EdgeResponseBytes": 1120,
            "EdgeRequestHost": "llm.example.com", "EdgeResponseStatus": status, "EdgeStartTimestamp": start,
            "RayID": f"8e1f2a3b4c5d{i:04x}", "OriginIP": "198.51.100.20", "OriginResponseStatus": origin,
            "OriginResponseDurationMs": int(seconds * 1000) if origin else 0, "CacheCacheStatus": "dynamic"}


def _write(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.parametrize("stamps", ["unixnano", "unix", "rfc3339"])
def test_logpush_fields(stamps):
    ev = FileParser("http_requests.log").parse(1, json.dumps(_record(1, 524, 0, 100.2, stamps)))[0]
    assert (ev.kind, ev.source) == ("http.access", "cloudflare")
    f = ev.fields
    assert (f["status"], f["upstream_status"], f["method"], f["path"], f["cut"], f["request_id"], f["upstream_addr"]) == (
        524, "0", "POST", "/v1/chat/completions", "timeout", "8e1f2a3b4c5d0001", "198.51.100.20")
    assert ev.ts == datetime(2025, 12, 2, 10, 0, 7)
    assert f["duration_s"] == (pytest.approx(100.2) if stamps == "unixnano" else 100.0)


def test_older_origin_response_time_in_nanoseconds():
    record = _record(0, 200, 200, 12.5)
    del record["OriginResponseDurationMs"], record["EdgeEndTimestamp"]
    record["OriginResponseTime"] = 12_500_000_000
    f = FileParser("http_requests.log").parse(1, json.dumps(record))[0].fields
    assert (f["duration_s"], f["upstream_s"], f["cut"]) == (12.5, 12.5, None)


def test_logpush_524s_are_the_gateway_timeout(tmp_path, diagnose_json):
    rows = [(200, 200, 12.3), (524, 0, 100.2), (200, 200, 8.1), (524, 0, 100.1), (524, 0, 100.3)]
    _write(tmp_path / "http_requests.log", [_record(i, *row) for i, row in enumerate(rows)])
    code, doc, err = diagnose_json(tmp_path)
    assert code == 1, err
    first = doc["findings"][0]
    assert (first["id"], first["confidence"]) == ("stream-cut-gateway-timeout", "high")
    assert first["affected_requests"]["count"] == 3 and first["evidence"][0]["count"] == 3
    assert "Cloudflare answers 524" in first["explanation"] and "Cloudflare" in first["next_steps"][0]
    assert doc["read"]["formats"] == {"cloudflare": 5} and doc["read"]["http_5xx"] == 3


def test_logpush_origin_down_is_the_engine(tmp_path, diagnose_json):
    rows = [(200, 200, 4.0), (522, 0, 19.0), (521, 0, 0.1), (520, 0, 3.2)]
    _write(tmp_path / "http_requests.log", [_record(i, *row) for i, row in enumerate(rows)])
    code, doc, err = diagnose_json(tmp_path)
    assert code == 1, err
    assert [(f["id"], f["confidence"]) for f in doc["findings"]] == [("engine-crash", "medium")]


def test_healthy_logpush_finds_nothing(tmp_path, diagnose_json):
    _write(tmp_path / "http_requests.log", [_record(i, 200, 200, 3.0 + i) for i in range(8)])
    code, doc, err = diagnose_json(tmp_path)
    assert (code, doc["findings"], doc["read"]["requests"]) == (0, [], 8), err


@pytest.mark.parametrize("obj", [
    {"EdgeResponseStatus": "ok", "RayID": "x"},  # not an HTTP status
    {"EdgeResponseStatus": 700},
    {"EdgeResponseStatus": True},
])
def test_other_json_is_no_cloudflare_record(obj):
    assert all(e.kind != "http.access" for e in FileParser("app.log").parse(1, json.dumps(obj)))


@pytest.mark.parametrize("line, first", [
    # Cloudflare's plain-text error body to an API client, inside the openai SDK's APIStatusError text
    ("openai.InternalServerError: Error code: 524 - 'error code: 524'", "stream-cut-gateway-timeout"),
    ("openai.InternalServerError: Error code: 522 - 'error code: 522'", "engine-crash"),
    ("<title>llm.example.com | 521: Web server is down</title>", "engine-crash"),
    ("<title>llm.example.com | 520: Web server is returning an unknown error</title>", "engine-crash"),
])
def test_client_side_52x(line, first, tmp_path, diagnose_json):
    (tmp_path / "client.log").write_text(line + "\n")
    code, doc, err = diagnose_json(tmp_path)
    assert code == 1, err
    assert doc["findings"][0]["id"] == first
