"""The gevent read path (what runs inside Locust): a client in a monkey-patched subprocess against the
mock server, for each outcome; keep-alive kept after complete bodies, read timeouts still timeouts."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CLIENT = r"""
import json, sys, time
import locust  # monkey-patches, as in a Locust run
from locust.clients import HttpSession
from locust.event import EventHook
from loadgen import chunked
from loadgen.client import RequestSpec, StreamSettings, run_request
from loadgen.records import RequestRecord
from loadgen.session import settle_environment

gevent_reads = [0]
plain = chunked.ChunkedBody._gevent_read
def counted(self):
    gevent_reads[0] += 1
    return plain(self)
chunked.ChunkedBody._gevent_read = counted

port, modes, timeout_s = int(sys.argv[1]), sys.argv[2].split(","), float(sys.argv[3])
session = HttpSession(f"http://127.0.0.1:{port}", request_event=EventHook(), user=None)
settle_environment(session, session.base_url)  # as ChatUser does: loadgen.session's fast path
body = {"model": "mock-model", "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 5,
        "stream": True, "stream_options": {"include_usage": True}}
out = []
for mode in modes:
    record = RequestRecord(request_id="r", worker="local", profile="steady", scheduled_unix=0.0)
    before = gevent_reads[0]
    run_request(session, RequestSpec("/v1/chat/completions", body, "chat", 5), record,
                StreamSettings(timeout_s=timeout_s), time.perf_counter())
    out.append({"outcome": record.outcome.value, "kind": record.failure_kind and record.failure_kind.value,
                "error": record.error, "chunks": record.num_chunks, "itl": len(record.itl_s),
                "tokens": record.output_tokens, "gevent_reads": gevent_reads[0] - before})
print(json.dumps(out))
"""


def run_client(port: int, modes: list[str], timeout_s: float = 5.0) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("LOCUST_SKIP_MONKEY_PATCH", None)
    proc = subprocess.run([sys.executable, "-c", CLIENT, str(port), ",".join(modes), str(timeout_s)],
                          env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_each_outcome_through_the_gevent_path(mock_process):
    faults = ("ok", "ok", "cut", "ok", "error", "nodone", "ok")
    server = mock_process(ttft_s=0.01, itl_s=0.005, faults=faults)
    results = run_client(server.port, list(faults))
    ok = [r for r, f in zip(results, faults, strict=True) if f == "ok"]
    assert all(r["outcome"] == "ok" and r["chunks"] == 5 and r["itl"] == 4 and r["tokens"] == 5 for r in ok)
    assert all(r["gevent_reads"] >= 4 for r in ok)  # the tokens came through the gevent read
    by_fault = dict(zip(faults, results, strict=True))
    assert by_fault["cut"]["kind"] == "stream_cut"
    assert by_fault["cut"]["error"].startswith("requests.exceptions.ChunkedEncodingError: ")
    assert by_fault["error"]["kind"] == "error_event"
    assert by_fault["nodone"]["kind"] == "stream_cut" and by_fault["nodone"]["error"].startswith("loadgen.StreamCut")
    stats = server.stats
    assert stats.num_requests == len(faults) and stats.num_disconnects == 0


def test_silence_is_a_read_timeout_through_the_gevent_path(mock_process):
    server = mock_process(ttft_s=0.01, itl_s=0.005, faults=("hang", "ok"))
    hang, after = run_client(server.port, ["hang", "ok"], timeout_s=0.3)
    assert (hang["outcome"], hang["kind"]) == ("failed", "timeout")
    assert hang["error"].startswith("requests.exceptions.ConnectionError: HTTPConnectionPool(")
    assert hang["error"].endswith("Read timed out.")
    assert after["outcome"] == "ok" and after["chunks"] == 5  # a new connection for the next request


def test_a_stream_longer_than_the_read_timeout_is_not_a_timeout(mock_process):
    # Five gaps of 0.2 s under a 1 s read timeout: the stream outlasts the timeout, no silence does.
    server = mock_process(ttft_s=0.2, itl_s=0.2)
    (result,) = run_client(server.port, ["ok"], timeout_s=1.0)
    assert result["outcome"] == "ok" and result["chunks"] == 5 and result["gevent_reads"] >= 4
