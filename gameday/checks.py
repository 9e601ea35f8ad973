"""What a game day checks: alerts seen in Prometheus, their runbooks, and llmtriage's verdict."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

from gameday.errors import GamedayError
from gameday.prom import PromClient
from gameday.stack import REPO_ROOT, child_env, python_entry

TRIAGE_TIMEOUT_S = 180.0


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(slots=True)
class AlertSeen:
    name: str
    instance: str
    labels: dict[str, str]
    annotations: dict[str, str]
    first_pending_s: float | None = None  # seconds since the scenario started
    first_firing_s: float | None = None
    first_firing_at: str | None = None  # wall clock, for the report
    last_seen_s: float = 0.0


@dataclass(slots=True)
class AlertWatcher:
    """Polls /api/v1/alerts every interval_s in a thread; remembers each alert's first times."""

    client: PromClient
    start_ts: float
    interval_s: float = 1.0
    seen: dict[tuple[str, str], AlertSeen] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="alert-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        try:
            alerts = self.client.alerts()
        except (OSError, GamedayError) as exc:
            self.errors.append(f"{_now_iso()} {exc}")
            return
        elapsed = time.monotonic() - self.start_ts
        for alert in alerts:
            key = (alert.name, alert.labels.get("instance", ""))
            entry = self.seen.setdefault(key, AlertSeen(alert.name, key[1], alert.labels, alert.annotations))
            entry.last_seen_s = round(elapsed, 1)
            if entry.first_pending_s is None:
                entry.first_pending_s = round(elapsed, 1)
            if alert.state == "firing" and entry.first_firing_s is None:
                entry.first_firing_s = round(elapsed, 1)
                entry.first_firing_at = _now_iso()
                entry.annotations = alert.annotations

    def firing(self) -> list[AlertSeen]:
        return [a for a in self.seen.values() if a.first_firing_s is not None]

    def firing_names(self) -> set[str]:
        return {a.name for a in self.firing()}

    def wait_for(self, groups: list[list[str]], timeout_s: float) -> bool:
        """Block until every group has one firing alert, or timeout_s passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            names = self.firing_names()
            if all(any(n in names for n in group) for group in groups):
                return True
            time.sleep(0.5)
        return False

    def to_json(self) -> list[dict]:
        return [asdict(a) for a in sorted(self.seen.values(), key=lambda a: (a.first_pending_s or 0, a.name))]


def runbook_file(runbook_url: str, root: Path = REPO_ROOT) -> Path | None:
    """The runbooks/ file named by the URL's last path segment (with or without .md), if it exists."""
    segment = urlparse(runbook_url).path.rstrip("/").rsplit("/", 1)[-1]
    if not segment:
        return None
    stem = segment.removesuffix(".md")
    path = root / "runbooks" / f"{stem}.md"
    return path if path.is_file() else None


@dataclass(slots=True)
class TriageResult:
    exit_code: int
    doc: dict | None
    stderr: str

    @property
    def finding_ids(self) -> list[str]:
        return [f.get("id", "") for f in (self.doc or {}).get("findings", [])]

    @property
    def first(self) -> dict | None:
        findings = (self.doc or {}).get("findings", [])
        return findings[0] if findings else None


def _triage(logs_dir: Path, prom_url: str, fmt: str) -> subprocess.CompletedProcess:
    argv = [*python_entry("triage.cli"), "diagnose", str(logs_dir), "--prometheus", prom_url, "--format", fmt]
    return subprocess.run(argv, capture_output=True, text=True, timeout=TRIAGE_TIMEOUT_S,
                          env={**os.environ, **child_env()}, cwd=REPO_ROOT)


def run_triage(logs_dir: Path, prom_url: str, out_dir: Path, also_text: bool = False) -> TriageResult:
    """llmtriage diagnose <logs> --prometheus URL --format json (and text); outputs kept in the report."""
    try:
        result = _triage(logs_dir, prom_url, "json")
        if also_text:
            (out_dir / "triage.txt").write_text(_triage(logs_dir, prom_url, "text").stdout)
    except subprocess.TimeoutExpired:
        return TriageResult(exit_code=124, doc=None, stderr=f"llmtriage timed out after {TRIAGE_TIMEOUT_S:.0f}s")
    (out_dir / "triage.json").write_text(result.stdout)
    (out_dir / "triage.stderr.txt").write_text(result.stderr)
    try:
        doc = json.loads(result.stdout)
    except ValueError:
        doc = None
    return TriageResult(exit_code=result.returncode, doc=doc, stderr=result.stderr[-2000:])
