"""--no-stream: one JSON answer per request through Locust's HttpSession, E2E only, failures by kind."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from loadgen.client import RequestSpec, StreamSettings
from loadgen.clientlog import ClientLog
from loadgen.nonstream import run_request
from loadgen.options import ConfigError, config_from_options
from loadgen.records import FailureKind, Outcome, RequestRecord, TokenSource
from tests.loadgen.conftest import user_session

ANSWER = {"id": "chatcmpl-abc", "object": "chat.completion", "model": "m",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello there"},
                       "finish_reason": "length"}],
          "usage": {"prompt_tokens": 7, "completion_tokens": 12, "total_tokens": 19,
                    "prompt_tokens_details": {"cached_tokens": 4}}}
DELAY_S = 0.05


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        mode = self.path.rsplit("/", 1)[-1]
        time.sleep(DELAY_S)
        if mode == "ok":
            self._send(200, json.dumps(ANSWER).encode())
        elif mode == "gateway":  # nginx's answer when proxy_read_timeout runs out
            self._send(504, b"<html><head><title>504 Gateway Time-out</title></head></html>", "text/html")
        elif mode == "cut":  # headers and half the promised body, then the connection closes
            data = json.dumps(ANSWER).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
        elif mode == "slow":
            time.sleep(1.0)
            self._send(200, json.dumps(ANSWER).encode())
        elif mode == "garbage":
            self._send(200, b"not json")

    def _send(self, status: int, data: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.bodies = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()


def send(server, mode: str, timeout_s: float = 5.0, log: ClientLog | None = None):
    events = []
    session = user_session(f"http://127.0.0.1:{server.server_address[1]}", events)
    record = RequestRecord(request_id="req-1", worker="local", profile="steady", scheduled_unix=0.0)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12, "stream": False}
    spec = RequestSpec(path=f"/v1/chat/completions/{mode}", body=body, name="chat", max_tokens=12)
    text = run_request(session, spec, record, StreamSettings(timeout_s=timeout_s), time.perf_counter(), log=log)
    return record, text, events


def test_answer_fills_e2e_usage_and_no_stream_timings(server):
    record, text, events = send(server, "ok")
    assert record.outcome is Outcome.OK and record.failure_kind is None and text == "hello there"
    assert record.e2e_s >= DELAY_S and record.end_s >= record.e2e_s
    assert record.ttft_s is None and record.itl_s == [] and record.tpot_s is None and record.num_chunks == 0
    assert (record.prompt_tokens, record.cached_tokens, record.output_tokens) == (7, 4, 12)
    assert record.output_tokens_source is TokenSource.USAGE
    assert (record.finish_reason, record.response_id, record.http_status) == ("length", "chatcmpl-abc", 200)
    assert events[0]["exception"] is None and events[0]["request_type"] == "POST"


@pytest.mark.parametrize("mode, kind, error", [
    ("gateway", FailureKind.HTTP_STATUS, "requests.exceptions.HTTPError: 504 Server Error: Gateway Timeout"),
    ("cut", FailureKind.STREAM_CUT, "requests.exceptions.ChunkedEncodingError: "),
    ("garbage", FailureKind.STREAM_CUT, "loadgen.BadBody: the response body is not JSON"),
])
def test_failures_by_kind_and_logged(server, tmp_path, mode, kind, error):
    log = ClientLog(tmp_path / "client.log")
    record, text, events = send(server, mode, log=log)
    log.close()
    assert record.outcome is Outcome.FAILED and record.failure_kind is kind and text == ""
    assert record.error.startswith(error), record.error
    assert events[0]["exception"].kind is kind
    line = (tmp_path / "client.log").read_text().strip()
    assert f"kind={kind.value}" in line and record.error in line


def test_read_timeout_is_a_timeout(server):
    record, _, _ = send(server, "slow", timeout_s=0.3)
    assert record.outcome is Outcome.FAILED and record.failure_kind is FailureKind.TIMEOUT
    assert "Read timed out" in record.error


def options(**kw) -> SimpleNamespace:
    base = dict(profile="steady", loadgen_profile="", endpoint="chat", api_key="", model="", prompt_tokens=64,
                output_tokens=0, dataset="", rate=1.0, max_concurrency=0, max_model_len=0, block_size=16,
                prefix_tokens=1024, turns=4, abort_after_tokens=3, stage_s=10.0, num_steps=4, slo_ttft_ms=0.0,
                slo_tpot_ms=0.0, slo_e2e_ms=0.0, report_dir=".", client_log="", client_log_format="text",
                timeout_s=300.0, seed=0, num_users=1, no_stream=False)
    return SimpleNamespace(**{**base, **kw})


def test_no_stream_option_and_its_conflicts():
    assert config_from_options(options()).stream is True
    assert config_from_options(options(no_stream=True)).stream is False
    with pytest.raises(ConfigError, match="--no-stream cannot be used with --profile abort"):
        config_from_options(options(no_stream=True, profile="abort"))
    with pytest.raises(ConfigError, match="--no-stream cannot be used with --slo-ttft-ms"):
        config_from_options(options(no_stream=True, slo_ttft_ms=500.0))
