"""End to end: a real llmserve scraped by a real Prometheus loaded with every shipped rule file."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from alerts_support import ROOT, rules_in

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, data: bytes | None = None, timeout: float = 30.0) -> bytes:
    headers = {"Content-Type": "application/json"} if data else {}
    with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=timeout) as resp:
        return resp.read()


def _wait(check, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


def _query(base: str, expr: str) -> list[dict]:
    body = _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    return json.loads(body)["data"]["result"]


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)


@pytest.fixture
def stack(tmp_path):
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus not found: install Debian's prometheus package (make system-deps)")
    engine_port, prom_port = _free_port(), _free_port()
    files = sorted((ROOT / "alerts").glob("*.rules.yml")) + sorted((ROOT / "alerts" / "adapters").glob("*.rules.yml"))
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(p) for p in files],
              "scrape_configs": [{"job_name": "llm-engine",
                                  "static_configs": [{"targets": [f"127.0.0.1:{engine_port}"]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    procs = [
        _start([sys.executable, "-m", "engine.server", "--host", "127.0.0.1", "--port", str(engine_port)],
               tmp_path / "engine.log"),
        _start(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}"], tmp_path / "prometheus.log"),
    ]
    try:
        yield f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{prom_port}"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_every_native_llm_series_is_recorded_from_a_real_engine(stack):
    engine, prom = stack
    _wait(lambda: _get(f"{engine}/ready", timeout=2) is not None, "llmserve /ready", 120)
    _wait(lambda: _get(f"{prom}/-/ready", timeout=2) is not None, "Prometheus /-/ready", 60)
    body = json.dumps({"model": "builtin", "max_tokens": 8,
                       "messages": [{"role": "user", "content": "The same opening words, then a question."}]})
    for _ in range(8):
        _get(f"{engine}/v1/chat/completions", body.encode())
    expected = {r["record"] for r in rules_in(ROOT / "alerts" / "engine.rules.yml")}

    def recorded() -> set[str]:
        rows = _query(prom, 'count by (__name__) ({__name__=~"llm:.+"})')
        return {row["metric"]["__name__"] for row in rows}

    _wait(lambda: expected <= recorded(), f"all of {sorted(expected)}", 60)
    (ready,) = _query(prom, "llm:engine_ready")
    assert ready["metric"]["model"] == "builtin" and ready["value"][1] == "1"
    (slo,) = _query(prom, "llm:ttft_slo_errors:ratio_rate5m")
    assert float(slo["value"][1]) == 0.0  # eight short requests on an idle engine, all under 2 s
    rules = json.loads(_get(f"{prom}/api/v1/rules"))["data"]["groups"]
    unhealthy = [r["name"] for g in rules for r in g["rules"] if r.get("health") not in ("ok", "unknown")]
    assert unhealthy == []
    assert _query(prom, 'ALERTS{alertstate="firing"}') == []
