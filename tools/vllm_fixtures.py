"""Copy the logs of vLLM game days into tests/triage/fixtures/vllm-0.32/<scenario>/ as triage fixtures.

    python tools/vllm_fixtures.py gameday-reports/20261201T215705Z [SCENARIO...]

Per scenario: vLLM's own log (engine-N.log: every line its processes printed), nginx's access and
error logs and config, the load generator's client log, and vLLM's /metrics at the end of the load
(metrics/engine-N.txt), unchanged. Files over 64 KiB are stored gzipped (llmtriage reads gzip);
result.json's verdict, alerts and triage's first finding go into expected.json.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / "tests" / "triage" / "fixtures" / "vllm-0.32"
GZIP_OVER = 64 * 1024


def _copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.stat().st_size > GZIP_OVER:
        with src.open("rb") as fin, gzip.GzipFile(dest.with_name(dest.name + ".gz"), "wb", mtime=0) as fout:
            shutil.copyfileobj(fin, fout)
    else:
        shutil.copyfile(src, dest)


def copy_scenario(report: Path) -> Path:
    out = DEST / report.name
    label = (out / "case.yaml").read_bytes() if (out / "case.yaml").exists() else None  # bench/triage_accuracy's
    if out.exists():
        shutil.rmtree(out)
    logs = report / "logs"
    for src in sorted(logs.glob("engine-*.log")) + sorted(logs.glob("client-*.log")):
        if src.stat().st_size:
            _copy(src, out / src.name)
    for name in ("access.log", "error.log", "nginx.conf"):
        if (logs / "nginx" / name).exists():
            _copy(logs / "nginx" / name, out / "nginx" / name)
    for src in sorted((report / "metrics").glob("engine-*.txt")):
        _copy(src, out / "metrics" / src.name)
    if label is not None:
        (out / "case.yaml").write_bytes(label)
    result = json.loads((report / "result.json").read_text())
    (out / "expected.json").write_text(json.dumps({
        "scenario": result["name"], "verdict": result.get("verdict", "pass" if result["passed"] else "fail"),
        "alerts_firing": result["alerts_firing"], "first_finding": result["first_finding"],
        "first_cause": result["first_cause"], "failures": result["failures"]}, indent=2) + "\n")
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    run = Path(argv[0])
    if not run.is_dir():
        print(f"vllm_fixtures: {run}: no such report folder", file=sys.stderr)
        return 2
    names = argv[1:] or sorted(p.name for p in run.iterdir() if (p / "result.json").exists())
    for name in names:
        if not (run / name / "result.json").exists():
            print(f"vllm_fixtures: {run / name} has no result.json", file=sys.stderr)
            return 2
        print(copy_scenario(run / name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
