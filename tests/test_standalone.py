"""A clone stands alone: no test, tool, benchmark, Makefile or CI file reads a path outside the repository."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Literal paths that leave the repository: a sibling folder (../shared), or this machine's layout.
_OUTSIDE = re.compile(r"\.\./(?:\.\./)*shared\b|/work/(?:shared|main|wt)\b|os\.pardir")
# Path(__file__)[.resolve()][.parents[N]][.parent...]: how many folders up it climbs.
_CLIMB = re.compile(r"Path\(__file__\)(?:\.resolve\(\))?(?:\.parents\[(\d+)\])?((?:\.parent\b)*)")


def _is_source(path: Path) -> bool:
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "tests" and "corpus" in rel.parts:
        return False  # recorded incident logs: data that names the paths of the machine that wrote them
    return path.suffix in (".py", ".sh", ".toml", ".cfg", ".ini") or path.name == "Makefile" \
        or rel.parts[0] == ".ci"


def outside_reads(rel: Path, text: str) -> list[str]:
    """Lines of `text` (the file at `rel` in the repository) that name a path outside the repository."""
    depth = len(rel.parts)  # `.parent` steps from the file up to the repository root
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if _OUTSIDE.search(line):
            found.append(f"{rel}:{number}: {line.strip()}")
            continue
        for match in _CLIMB.finditer(line):
            index, parents = match.groups()
            up = (int(index) + 1 if index is not None else 0) + parents.count(".parent")
            if up > depth:
                found.append(f"{rel}:{number}: climbs {up} steps, {depth} reach the root: {line.strip()}")
    return found


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    return [ROOT / name for name in out.splitlines() if (ROOT / name).is_file()]


def test_no_source_reads_outside_the_repository():
    this = Path(__file__).resolve()
    found = []
    for path in tracked_files():
        if path == this or not _is_source(path):
            continue
        found += outside_reads(path.relative_to(ROOT), path.read_text(errors="replace"))
    assert found == []


def test_the_scan_catches_each_way_out():
    rel = Path("tests/server/openai_schemas.py")
    bad = [
        'SCHEMA = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "x.json"',
        'SCHEMA = Path(__file__).parents[3] / "x.json"',
        'SCHEMA = Path(__file__).parent.parent.parent.parent / "x.json"',
        'open("../shared/reference/openai-schemas.json")',
        'CORPUS = "/work/shared/triage-corpus"',
        'os.path.join(HERE, os.pardir, os.pardir, os.pardir)',
    ]
    assert [len(outside_reads(rel, line)) for line in bad] == [1] * len(bad)
    good = [
        'ROOT = Path(__file__).resolve().parents[2]',
        'HERE = Path(__file__).parent / "fixtures"',
        'shared = list(range(60, 72))',
    ]
    assert [outside_reads(rel, line) for line in good] == [[]] * len(good)
    assert outside_reads(Path("Makefile"), "\tcp ../shared/x .") != []
