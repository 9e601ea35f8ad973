"""engine/core and engine/model import nothing of prometheus_client, fastapi, opentelemetry, pynvml."""

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import engine.core
import engine.model

FORBIDDEN = ("prometheus_client", "fastapi", "opentelemetry", "pynvml")
ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (engine.core, engine.model)


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_source_file_imports_a_forbidden_package():
    files = [f for package in PACKAGES for f in Path(package.__path__[0]).glob("*.py")]
    assert len(files) >= 10
    offenders = {str(f.relative_to(ROOT)): sorted(imported_roots(f) & set(FORBIDDEN)) for f in files}
    assert {f: bad for f, bad in offenders.items() if bad} == {}


def test_importing_the_packages_loads_nothing_forbidden_beyond_torch():
    names = [f"{p.__name__}.{m.name}" for p in PACKAGES for m in pkgutil.iter_modules(p.__path__)]
    assert "engine.core.engine" in names and "engine.model.llama" in names
    # A fresh interpreter; torch.cuda itself imports pynvml when it is installed, so that part
    # of the baseline is torch's, not ours.
    code = (
        "import importlib, sys\n"
        "import torch, safetensors, tokenizers, jinja2\n"
        f"forbidden = lambda: {{m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}}}\n"
        "baseline = forbidden()\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "print(','.join(sorted(forbidden() - baseline)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert result.stdout.strip() == ""
