"""Generate dashboards/*.json from dashboards/boards.py.

    python -m dashboards           # write dashboards/*.json
    python -m dashboards --check   # exit 1 if a committed JSON differs (the tests run this)

Every query reads llm:* recording series or `up` only, so the boards work on llmserve, vLLM and
SGLang alike; edit boards.py, never the JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dashboards.boards import boards
from dashboards.grafana import render_text

HERE = Path(__file__).resolve().parent


def stale_boards(directory: Path = HERE) -> dict[Path, str]:
    """path -> expected text, for every dashboard whose file is missing or differs."""
    out = {}
    for board in boards():
        path = directory / f"{board.uid}.json"
        text = render_text(board)
        if not path.exists() or path.read_text() != text:
            out[path] = text
    return out


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report out-of-date dashboards (exit 1)")
    args = parser.parse_args(argv)
    stale = stale_boards()
    for path, text in stale.items():
        if args.check:
            print(f"out of date: dashboards/{path.name} (run python -m dashboards)", file=sys.stderr)
        else:
            path.write_text(text)
            print(f"wrote dashboards/{path.name}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(run())
