"""Prometheus for a game day: config, start on loopback, and the few API calls the checks need."""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gameday.errors import GamedayError, ToolMissingError
from gameday.procs import Proc, ProcSpec, Supervisor, http_get, wait_until

SCRAPE_INTERVAL = "1s"
# Prometheus allows no timeout beyond the interval: a target that takes longer reads as up 0 for
# one scrape, which the drill's floor on target-down `for`s (gameday.drill) rides out.
SCRAPE_TIMEOUT = "1s"
EVALUATION_INTERVAL = "1s"


@dataclass(slots=True)
class PromConfig:
    listen_port: int
    engine_targets: list[str]  # "127.0.0.1:PORT"
    exporter_targets: list[str] = field(default_factory=list)
    rule_files: list[Path] = field(default_factory=list)


def render_config(cfg: PromConfig) -> str:
    doc = {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_TIMEOUT,
                   "evaluation_interval": EVALUATION_INTERVAL},
        "rule_files": [str(p) for p in cfg.rule_files],
        "scrape_configs": [
            {"job_name": "llm-engine", "static_configs": [{"targets": cfg.engine_targets}]},
            {"job_name": "llm-gpu-exporter", "static_configs": [{"targets": cfg.exporter_targets}]},
        ],
    }
    return yaml.safe_dump(doc, sort_keys=False)


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        raise ToolMissingError("prometheus not found: install the Debian package (make system-deps)")
    return path


def start_prometheus(sup: Supervisor, cfg: PromConfig, data_dir: Path, log_dir: Path,
                     timeout_s: float = 30.0) -> tuple[Proc, PromClient]:
    """Write prometheus.yml, start Prometheus with its TSDB in data_dir, wait for /-/ready."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    conf = log_dir / "prometheus.yml"
    conf.write_text(render_config(cfg))
    argv = [prometheus_binary(), f"--config.file={conf}", f"--storage.tsdb.path={data_dir}",
            f"--web.listen-address=127.0.0.1:{cfg.listen_port}", "--storage.tsdb.retention.time=1d",
            "--web.enable-lifecycle", "--log.level=info"]
    proc = sup.start(ProcSpec(name="prometheus", argv=argv, log_path=log_dir / "prometheus.log"))
    client = PromClient(f"http://127.0.0.1:{cfg.listen_port}")
    wait_until(lambda: http_get(client.base_url + "/-/ready")[0] == 200, proc, timeout_s, "Prometheus /-/ready")
    return proc, client


@dataclass(slots=True)
class Alert:
    name: str
    state: str  # pending | firing
    labels: dict[str, str]
    annotations: dict[str, str]
    active_at: str


@dataclass(slots=True)
class PromClient:
    base_url: str

    def _get(self, path: str, params: dict[str, str] | None = None) -> dict:
        url = self.base_url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        status, body = http_get(url, timeout_s=10)
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise GamedayError(f"Prometheus {path}: HTTP {status}, not JSON") from exc
        if doc.get("status") != "success":
            raise GamedayError(f"Prometheus {path}: {doc.get('errorType')}: {doc.get('error')}")
        return doc["data"]

    def alerts(self) -> list[Alert]:
        data = self._get("/api/v1/alerts")
        return [Alert(name=a["labels"].get("alertname", ""), state=a["state"], labels=a["labels"],
                      annotations=a.get("annotations", {}), active_at=a.get("activeAt", ""))
                for a in data["alerts"]]

    def query(self, expr: str) -> list[dict]:
        return self._get("/api/v1/query", {"query": expr})["result"]

    def query_range(self, expr: str, start: float, end: float, step_s: float = 1.0) -> list[dict]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}s"}
        return self._get("/api/v1/query_range", params)["result"]

    def rule_groups(self) -> list[dict]:
        return self._get("/api/v1/rules")["groups"]

    def targets_seen(self, job: str) -> int:
        """How many targets of job have been scraped at least once, answering or not."""
        return len(self.query(f'up{{job="{job}"}}'))

    def wait_scraped(self, job: str, num_targets: int, timeout_s: float = 60.0) -> None:
        """Wait until every target of job has been scraped once. A target that is already down
        (an engine that crashed before Prometheus started) counts: its up 0 is what the alert reads.
        A query that times out is a Prometheus still starting on a starved CPU (one took over 10 s
        on a busy 2-core machine): not scraped yet, asked again until the deadline."""
        deadline = time.monotonic() + timeout_s
        unanswered = 0
        while True:
            try:
                if self.targets_seen(job) >= num_targets:
                    return
            except OSError as exc:  # urllib: TimeoutError on the read, URLError(timeout) on the connect
                if not isinstance(exc, TimeoutError) and not isinstance(getattr(exc, "reason", None), TimeoutError):
                    raise
                unanswered += 1
            if time.monotonic() > deadline:
                suffix = f"; {unanswered} queries unanswered within 10 s" if unanswered else ""
                raise GamedayError(f"Prometheus: job {job} not scraped ({num_targets} targets) in "
                                   f"{timeout_s:.0f}s{suffix}")
            time.sleep(0.5)
