"""--prometheus against a real Prometheus (Debian package) scraping a tiny exposition server on loopback."""

import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.triage.conftest import CORPUS
from triage.promapi import _series_event

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="Debian prometheus not installed (make system-deps)")


class _Engine(BaseHTTPRequestHandler):
    """An engine's /metrics: preemptions climb with every scrape, the KV cache is full."""

    scrapes = 0

    def do_GET(self):  # noqa: N802 (http.server's name)
        type(self).scrapes += 1
        body = (f'llm_preemptions_total{{model="builtin"}} {7 * type(self).scrapes}\n'
                'llm_kv_cache_usage_ratio{model="builtin"} 1.0\n'
                'llm_engine_info{model="builtin",prefix_caching="true",block_size="16"} 1\n').encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _samples(base: str) -> int:
    url = f"{base}/api/v1/query?query=count_over_time(llm_preemptions_total[5m])"
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            result = json.load(resp)["data"]["result"]
    except OSError:
        return 0
    return int(float(result[0]["value"][1])) if result else 0


@pytest.fixture
def prometheus(tmp_path):
    engine = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""global:
  scrape_interval: 1s
scrape_configs:
  - job_name: llm-engine
    static_configs:
      - targets: ["127.0.0.1:{engine.server_address[1]}"]
""")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):  # poll until two scrapes are stored; no timing is asserted
            if _samples(base) >= 2:
                break
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        engine.shutdown()


def test_metrics_become_evidence(prometheus, run_cli):
    now = datetime.now(UTC)
    code, out, err = run_cli("diagnose", CORPUS / "nginx-healthy" / "access.log", "--prometheus", prometheus,
                             "--since", (now - timedelta(minutes=5)).isoformat(), "--until", (now + timedelta(minutes=1)).isoformat(),
                             "--format", "json")
    doc = json.loads(out)
    assert code == 1, (err, out)
    first = doc["findings"][0]
    assert first["id"] == "kv-preemption" and first["confidence"] == "high"
    sources = {e["file"] for e in first["evidence"]}
    assert f"{prometheus}/api/v1/query_range" in sources
    metric = next(e for e in first["evidence"] if e["signal"] == "metric.preemptions")
    assert metric["decisive"] and metric["line"] is None
    assert metric["text"].startswith('llm_preemptions_total{instance="127.0.0.1:')
    increase = float(re.search(r"increase ([\d.]+)", metric["text"]).group(1))
    assert increase >= 7 and increase % 7 == 0  # the counter climbs by 7 per scrape


def test_gauge_evidence_has_no_increase():
    """A gauge's evidence gives its range; an "increase" only means something for a counter."""
    series = {"metric": {"__name__": "x", "instance": "a:1"}, "values": [[0, "0.5"], [1, "1"], [2, "0.25"]]}
    gauge = _series_event("http://p", "kv_usage", 'llm_kv_cache_usage_ratio{job="llm-engine"}', series)
    assert gauge.text == ('llm_kv_cache_usage_ratio{instance="a:1"} over the window: first 0.5, last 0.25, '
                          "min 0.25, max 1")
    counter = _series_event("http://p", "preemptions_total", 'llm_preemptions_total{job="llm-engine"}', series)
    assert counter.text.endswith("min 0.25, max 1, increase " + f"{counter.fields['increase']:g}")
