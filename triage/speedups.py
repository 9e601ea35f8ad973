"""The C checks (triage/_speedups.c), or None where they cannot run: not built (no C compiler when pip
installed the package), a build older than this code (another API number), or LLMTRIAGE_PURE_PYTHON
set (to rule them out). Every caller has a Python path that answers the same."""

import os

API = 4  # the interface of triage/_speedups.c the callers use

try:
    from triage import _speedups as C
except ImportError:
    C = None
if os.environ.get("LLMTRIAGE_PURE_PYTHON") or getattr(C, "API", None) != API:
    C = None
