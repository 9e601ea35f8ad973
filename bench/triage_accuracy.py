"""How often `llmtriage diagnose` names the right cause first, per label, on a folder of labelled cases.

Each case is a folder of log files plus `case.yaml` (`label`, optional `cause` for cache-miss) or,
for the project's own synthetic corpus, `expected.json` (`first`, `cause`; `first: null` is healthy).
The case's log files are copied into a temporary folder without the label file, as a user would pass
them, and the real CLI (`triage.cli.main`, JSON output) runs on that folder.

A case is right when the first finding's label is the case's label (for cache-miss with a `cause`, the
cause must match too); a `healthy` case is right when nothing of medium or high confidence is found.
A traceback from llmtriage counts as a failure and is reported. Last line: one JSON object.

  python bench/triage_accuracy.py /path/to/cases
  python bench/triage_accuracy.py tests/triage/corpus --verbose
"""

import argparse
import contextlib
import io
import json
import shutil
import sys
import tempfile
import traceback
from collections import defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from triage.cli import main as llmtriage  # noqa: E402

LABEL_FILES = ("case.yaml", "expected.json")
HEALTHY = "healthy"
# Finding id -> corpus label. Every finding id is its own label; the table is explicit so that a
# renamed finding (or a corpus label that no finding produces) shows here and not as a silent miss.
FINDING_TO_LABEL = {
    "driver-mismatch": "driver-mismatch",
    "oom-weights": "oom-weights",
    "oom-kv-capacity": "oom-kv-capacity",
    "oom-runtime": "oom-runtime",
    "engine-crash": "engine-crash",
    "context-overflow": "context-overflow",
    "kv-preemption": "kv-preemption",
    "queue-backlog": "queue-backlog",
    "stream-cut-gateway-timeout": "stream-cut-gateway-timeout",
    "stream-cut-client-disconnect": "stream-cut-client-disconnect",
    "stream-cut-proxy-buffering": "stream-cut-proxy-buffering",
    "cache-miss": "cache-miss",
    "unrecognised-error": "unrecognised-error",  # never a corpus label: low confidence, always a miss
}


class CaseError(Exception):
    """A case folder whose label file cannot be read."""


def read_label(case: Path) -> tuple[str, str | None]:
    yml, js = case / "case.yaml", case / "expected.json"
    try:
        if yml.is_file():
            doc = yaml.safe_load(yml.read_text())
            if not isinstance(doc, dict) or not isinstance(doc.get("label"), str):
                raise CaseError(f"{yml}: no 'label' string")
            return doc["label"], doc.get("cause")
        doc = json.loads(js.read_text())
    except (OSError, yaml.YAMLError, json.JSONDecodeError) as exc:
        raise CaseError(f"{case}: unreadable label file ({exc})") from exc
    if not isinstance(doc, dict) or "first" not in doc:
        raise CaseError(f"{js}: no 'first' key")
    first = doc["first"]
    return (HEALTHY, None) if first is None else (first, doc.get("cause") if first == "cache-miss" else None)


def find_cases(folder: Path) -> list[Path]:
    """Case folders under folder, at any depth (a folder per label of case folders is fine); a case's own
    subfolders (nginx/, logs/) belong to it."""
    out: list[Path] = []
    for p in sorted(q for q in folder.iterdir() if q.is_dir()):
        if any((p / f).is_file() for f in LABEL_FILES):
            out.append(p)
        else:
            out.extend(find_cases(p))
    return out


def run_case(case: Path) -> dict:
    """The CLI's JSON document for the case's log files (copied without the label file), or an error."""
    with tempfile.TemporaryDirectory(prefix="triage-case-") as tmp:
        dest = Path(tmp) / case.name
        shutil.copytree(case, dest, ignore=shutil.ignore_patterns(*LABEL_FILES))
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = llmtriage(["diagnose", str(dest), "--format", "json"])
        except Exception:  # a traceback is a failure of llmtriage: counted and shown
            return {"error": traceback.format_exc()}
        stderr = err.getvalue()
        if "Traceback (most recent call last)" in stderr:
            return {"error": stderr}
        if code == 2:
            return {"error": f"exit 2: {stderr.strip()}"}
        try:
            return json.loads(out.getvalue())
        except json.JSONDecodeError:
            return {"error": f"not JSON: {out.getvalue()[:200]!r}"}


def judge(label: str, cause: str | None, doc: dict) -> tuple[bool, str]:
    """(right, what was predicted) for one case."""
    if "error" in doc:
        return False, "error"
    findings = doc.get("findings", [])
    if label == HEALTHY:
        loud = [f for f in findings if f["confidence"] in ("medium", "high")]
        return not loud, HEALTHY if not loud else _name(loud[0])
    if not findings:
        return False, "nothing"
    first = findings[0]
    predicted = FINDING_TO_LABEL.get(first["id"], first["id"])
    right = predicted == label and (label != "cache-miss" or cause is None or first.get("cause") == cause)
    return right, _name(first)


def _name(finding: dict) -> str:
    label = FINDING_TO_LABEL.get(finding["id"], finding["id"])
    cause = f":{finding['cause']}" if label == "cache-miss" and finding.get("cause") else ""
    return f"{label}{cause}({finding['confidence']})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="folder of case folders")
    ap.add_argument("--verbose", "-v", action="store_true", help="print every case, not only the misses")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        print(f"triage_accuracy: no such folder: {args.folder}", file=sys.stderr)
        return 2
    cases = find_cases(args.folder)
    if not cases:
        print(f"triage_accuracy: no case folders (with case.yaml or expected.json) in {args.folder}",
              file=sys.stderr)
        return 2
    per_label: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    misses, errors = [], []
    for case in cases:
        try:
            label, cause = read_label(case)
        except CaseError as exc:
            print(f"triage_accuracy: {exc}", file=sys.stderr)
            return 2
        doc = run_case(case)
        right, predicted = judge(label, cause, doc)
        key = f"{label}:{cause}" if label == "cache-miss" and cause else label
        per_label[label][1] += 1
        per_label[label][0] += int(right)
        if "error" in doc:
            errors.append(case.name)
            print(f"ERROR {case.name}: {doc['error'].strip().splitlines()[-1]}")
        if not right:
            misses.append(case.name)
        if args.verbose or not right:
            print(f"{'ok  ' if right else 'MISS'} {case.name:<48} expected {key:<32} got {predicted}")
    total = len(cases)
    right_total = sum(r for r, _ in per_label.values())
    print()
    print(f"{'label':<32} {'right':>5} / {'n':<3} accuracy")
    for label in sorted(per_label):
        r, n = per_label[label]
        print(f"{label:<32} {r:>5} / {n:<3} {r / n:6.0%}")
    print(f"{'all':<32} {right_total:>5} / {total:<3} {right_total / total:6.1%}")
    healthy_r, healthy_n = per_label.get(HEALTHY, [0, 0])
    print(json.dumps({
        "cases": total, "right": right_total, "accuracy": round(right_total / total, 4),
        "per_label": {k: {"right": r, "n": n} for k, (r, n) in sorted(per_label.items())},
        "healthy_quiet": healthy_r == healthy_n, "errors": errors, "misses": misses,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
