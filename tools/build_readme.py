"""Assemble README.md's reference sections from the part docs (one source of truth each)."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def section(doc: str, heading: str) -> str:
    """The body of `## heading` in docs/<doc> (up to the next heading of level 2)."""
    text = (ROOT / "docs" / doc).read_text()
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if match is None:
        sys.exit(f"build_readme: no '## {heading}' in docs/{doc}")
    return match.group(1).strip()


def main() -> None:
    template = (ROOT / "tools" / "README.template.md").read_text()
    out = re.sub(r"\{\{ (\S+) / (.+?) \}\}", lambda m: section(m.group(1), m.group(2)), template)
    target = ROOT / "README.md"
    if "--check" in sys.argv:
        if target.read_text() != out:
            sys.exit("README.md is out of date: run python tools/build_readme.py")
        return
    target.write_text(out)


if __name__ == "__main__":
    main()
