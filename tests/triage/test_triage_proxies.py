"""Traefik's and Caddy's access logs read as access lines (status, duration, upstream), and the error fields of
structured proxy logs read with their message."""

import json
import shutil
from pathlib import Path

import pytest

from triage.parsers import FileParser
from triage.parsers.text_logs import split_envelope

TRAEFIK_CLF = ('10.0.0.5 - - [12/Mar/2024:10:15:02 +0000] "POST /v1/chat/completions HTTP/1.1" 504 15 "-" '
               '"OpenAI/Python 1.14.0" 1542 "vllm@docker" "http://172.18.0.3:8000" 60001ms')


def _traefik_json(**over) -> dict:
    row = {"ClientAddr": "10.0.0.5:51234", "ClientHost": "10.0.0.5", "DownstreamContentSize": 15,
           "DownstreamStatus": 504, "Duration": 30001432171, "OriginContentSize": 15, "OriginDuration": 30001123456,
           "OriginStatus": 504, "RequestCount": 1542, "RequestMethod": "POST", "RequestPath": "/v1/chat/completions",
           "RequestProtocol": "HTTP/1.1", "RouterName": "vllm@docker", "ServiceAddr": "172.18.0.3:8000",
           "ServiceName": "vllm@docker", "ServiceURL": "http://172.18.0.3:8000",
           "StartUTC": "2024-03-12T10:15:02.118423061Z", "level": "info", "msg": "", "time": "2024-03-12T10:15:32Z"}
    row.update(over)
    return row


def _caddy_json(**over) -> dict:
    row = {"level": "info", "ts": 1710238442.118, "logger": "http.log.access.log0", "msg": "handled request",
           "request": {"remote_ip": "10.0.0.5", "remote_port": "51234", "client_ip": "10.0.0.5", "proto": "HTTP/1.1",
                       "method": "POST", "host": "llm.example.com", "uri": "/v1/chat/completions",
                       "headers": {"User-Agent": ["OpenAI/Python 1.14.0"]}},
           "bytes_read": 1842, "user_id": "", "duration": 12.873512, "size": 18234, "status": 200,
           "resp_headers": {"Server": ["Caddy"]}}
    row.update(over)
    return row


def _access(line: str):
    events = [e for e in FileParser("access.log").parse(1, line) if e.kind == "http.access"]
    assert len(events) == 1, events
    return events[0]


def test_traefik_common_format_reads_its_duration_and_server():
    ev = _access(TRAEFIK_CLF)
    f = ev.fields
    assert ev.source == "traefik"
    assert (f["status"], f["duration_s"], f["upstream_addr"], f["method"], f["path"], f["cut"]) == (
        504, 60.001, "172.18.0.3:8000", "POST", "/v1/chat/completions", "timeout")


def test_a_combined_line_with_other_fields_after_it_is_still_nginx():
    ev = _access('10.0.0.5 - - [13/Mar/2024:10:15:02 +0000] "POST /v1/chat/completions HTTP/1.1" 504 51 "-" '
                 '"OpenAI/Python 1.14.0" kong_request_id: "8a4e2c5b7f1d3e9a0b6c4d2e"')
    assert ev.source == "nginx-access" and ev.fields["cut"] == "timeout" and ev.fields["duration_s"] is None


def test_traefik_json_access_line():
    ev = _access(json.dumps(_traefik_json()))
    f = ev.fields
    assert ev.source == "traefik" and ev.ts.isoformat() == "2024-03-12T10:15:02.118423"
    assert (f["status"], f["duration_s"], f["upstream_s"], f["upstream_addr"], f["upstream_status"], f["cut"]) == (
        504, 30.001432171, 30.001123456, "172.18.0.3:8000", "504", "timeout")
    assert f["request"] == "POST /v1/chat/completions HTTP/1.1" and f["client"] == "10.0.0.5"


def test_traefik_2_json_service_url_object_falls_back_to_nothing():
    row = _traefik_json(DownstreamStatus=499, ServiceURL={"Scheme": "http", "Host": "172.18.0.3:8000"})
    del row["ServiceAddr"]
    f = _access(json.dumps(row)).fields
    assert f["upstream_addr"] is None and f["cut"] == "client"


@pytest.mark.parametrize(("over", "duration", "cut"), [
    ({}, 12.873512, None),
    ({"status": 502, "level": "error", "duration": 0.0021}, 0.0021, "upstream_failed"),
    ({"status": 0, "duration": 35.12, "size": 0}, 35.12, "client"),  # a client gone before the headers (<= 2.10)
    ({"status": 499, "duration": "1m0.5s"}, 60.5, "client"),  # duration_format string
    ({"status": 504, "duration": "250ms", "ts": "2024-03-12T10:14:02.118Z"}, 0.25, "timeout"),
])
def test_caddy_access_entry(over, duration, cut):
    ev = _access(json.dumps(_caddy_json(**over)))
    f = ev.fields
    assert ev.source == "caddy" and ev.ts is not None and ev.ts.year == 2024
    assert (f["duration_s"], f["cut"], f["method"], f["path"], f["client"]) == (
        pytest.approx(duration), cut, "POST", "/v1/chat/completions", "10.0.0.5")


@pytest.mark.parametrize("obj", [
    {"level": "info", "msg": "handled request", "status": 200},  # no request object
    {"level": "info", "msg": "handled request", "status": 700, "request": {}},
    {"DownstreamStatus": "ok", "Duration": 1},
])
def test_other_json_is_no_proxy_access_line(obj):
    assert all(e.kind != "http.access" for e in FileParser("app.log").parse(1, json.dumps(obj)))


def test_a_structured_log_lines_error_field_is_read_with_its_message():
    """zap (Caddy) and zerolog (Traefik) put the cause in "error", apart from the message."""
    line = json.dumps({"level": "warn", "ts": 1710238502.551, "logger": "http.handlers.reverse_proxy",
                       "msg": "aborting with incomplete response", "upstream": "vllm:8000", "duration": 20.1,
                       "error": "reading: context canceled"})
    events = FileParser("caddy.log").parse(1, line)
    assert [e.kind for e in events] == ["gateway.client_closed"]
    assert events[0].ts.isoformat() == "2024-03-12T10:15:02.551000" and events[0].text == line
    upstream_gone = line.replace("context canceled", "unexpected EOF")
    assert [e.kind for e in FileParser("caddy.log").parse(1, upstream_gone)] == ["gateway.upstream_closed"]


def test_litellm_no_deployments_is_a_hint_not_a_queue(tmp_path, diagnose_json):
    """LiteLLM's router answers 429 'No deployments available' while every deployment cools down after
    failures: the failures name the cause, the 429 alone is no queue backlog."""
    (tmp_path / "litellm.log").write_text(
        "10:20:11 - LiteLLM Proxy:ERROR: proxy_server.py:3436 - litellm.proxy.proxy_server.chat_completion(): "
        "Exception occured - litellm.RateLimitError: No deployments available for selected model, Try again in 5 "
        "seconds. Passed model=qwen2.5-7b. pre-call-checks=False, cooldown_list=[]\n")
    code, doc, err = diagnose_json(tmp_path)
    assert [f["id"] for f in doc["findings"] if f["confidence"] != "low"] == [], err


@pytest.mark.parametrize(("line", "status", "upstream", "upstream_status"), [
    ('[12/Mar/2024:10:15:32 +0000] - 504 504 - POST https llm.example.com "/api/chat" [Client 10.0.0.5] '
     '[Length 167] [Gzip -] [Sent-to 172.18.0.3] "Mozilla/5.0 (X11; Linux x86_64)" "https://llm.example.com/"',
     504, "172.18.0.3", "504"),
    ('[12/Mar/2024:10:15:32 +0000] - - 499 - POST https llm.example.com "/api/chat" [Client 10.0.0.5] '
     '[Length 0] [Gzip -] [Sent-to ollama] "Mozilla/5.0 (X11; Linux x86_64)" "-"', 499, "ollama", None),
    ('[12/Mar/2024:10:15:32 +0000] 502 - POST https llm.example.com "/api/chat" [Client 10.0.0.5] '
     '[Length 166] [Gzip 3.21] "Mozilla/5.0 (X11; Linux x86_64)" "-"', 502, None, None),  # log_format standard
])
def test_nginx_proxy_manager_access_line(line, status, upstream, upstream_status):
    ev = _access(line)
    f = ev.fields
    assert ev.source == "nginx-access" and ev.ts.isoformat() == "2024-03-12T10:15:32"
    assert (f["status"], f["upstream_addr"], f.get("upstream_status"), f["method"], f["path"], f["client"]) == (
        status, upstream, upstream_status, "POST", "/api/chat", "10.0.0.5")


@pytest.mark.parametrize(("line", "ts", "message"), [
    ("[Wed Mar 13 10:15:02.123456 2024] [proxy_http:error] [pid 9:tid 140311105029824] (70007)The timeout specified "
     "has expired: [client 10.0.0.5:53211] AH01102: error reading status line from remote server 127.0.0.1:8000",
     "2024-03-13T10:15:02", "(70007)The timeout specified has expired: [client 10.0.0.5:53211] AH01102: "),
    ("[Sun Mar  3 10:15:02 2024] [error] [client 10.0.0.5] (70007)The timeout specified has expired: proxy: error "
     "reading status line from remote server 127.0.0.1", "2024-03-03T10:15:02", "[client 10.0.0.5] (70007)"),
    ('time="2023-06-01T10:05:12Z" level=debug msg="\'499 Client Closed Request\' caused by: context canceled"',
     "2023-06-01T10:05:12", "'499 Client Closed Request' caused by"),
    ('2024/03/12 10:15:02.118\tWARN\thttp.handlers.reverse_proxy\taborting with incomplete response\t{"error": '
     '"reading: context canceled"}', "2024-03-12T10:15:02", "WARN\thttp.handlers.reverse_proxy\taborting"),
])
def test_proxy_error_log_heads_give_the_time(line, ts, message):
    """Apache httpd's error log, logrus's text format (Traefik 2.x) and Go's slash-dated heads (zap's console
    encoder, Caddy in a terminal): the time is read and the message is what follows it."""
    events = FileParser("error.log").parse(1, line)
    assert events and all(e.ts.isoformat() == ts for e in events)
    assert split_envelope(line)[1].startswith(message)


def test_caddy_console_access_entry():
    line = ('2024/03/12 10:15:32.118\tERROR\thttp.log.access.log0\thandled request\t{"request": {"remote_ip": '
            '"10.0.0.5", "client_ip": "10.0.0.5", "proto": "HTTP/1.1", "method": "POST", "host": "llm.example.com", '
            '"uri": "/v1/chat/completions"}, "bytes_read": 1842, "user_id": "", "duration": 30.001532, "size": 0, '
            '"status": 504, "resp_headers": {"Server": ["Caddy"]}}')
    ev = _access(line)
    assert ev.source == "caddy" and ev.ts.isoformat() == "2024-03-12T10:15:32"
    assert (ev.fields["status"], ev.fields["duration_s"], ev.fields["cut"]) == (504, 30.001532, "timeout")


@pytest.mark.parametrize(("case", "step"), [
    ("traefik-json-504", "Traefik: raise serversTransport"), ("apache-proxy-read-timeout", "Apache httpd: raise ProxyTimeout"),
    ("litellm-proxy-timeout-call-id", "LiteLLM: raise timeout"), ("caddy-console-response-header-timeout", "Caddy: raise"),
])
def test_a_gateway_timeout_names_the_timeout_of_the_gateway_that_cut(case, step, tmp_path, diagnose_json):
    folder = tmp_path / case
    shutil.copytree(Path(__file__).parent / "real" / case, folder, ignore=shutil.ignore_patterns("case.yaml"))
    code, doc, err = diagnose_json(folder)
    first = doc["findings"][0]
    assert first["id"] == "stream-cut-gateway-timeout" and first["next_steps"][0].startswith(step), err


def test_kong_log_plugin_entry():
    obj = {"request": {"id": "9b5f3d6c8e2a4f0b1c7d5e3f", "uri": "/v1/chat/completions", "method": "POST", "size": 1842},
           "upstream_uri": "/v1/chat/completions", "upstream_status": "504", "response": {"status": 504, "size": 51},
           "latencies": {"kong": 1, "proxy": 60000, "request": 60001, "receive": 0},
           "tries": [{"balancer_start": 1710238502551, "ip": "172.18.0.3", "port": 8000, "balancer_latency": 0}],
           "client_ip": "10.0.0.5", "started_at": 1710238502551, "source": "kong"}
    ev = _access(json.dumps(obj))
    f = ev.fields
    assert ev.source == "kong" and ev.ts.isoformat() == "2024-03-12T10:15:02.551000"
    assert (f["status"], f["duration_s"], f["upstream_s"], f["upstream_addr"], f["request_id"], f["cut"]) == (
        504, 60.001, 60.0, "172.18.0.3:8000", "9b5f3d6c8e2a4f0b1c7d5e3f", "timeout")
    assert all(e.kind != "http.access" for e in FileParser("app.log").parse(1, json.dumps(
        {"latencies": {"request": 1}, "response": "ok", "request": {}})))
