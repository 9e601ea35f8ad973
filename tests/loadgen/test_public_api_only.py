"""loadgen/ reaches gevent, urllib3, requests and http.client through their public APIs only.

Any `x._name` attribute (or getattr/setattr with a `_name` string) on something that is not the
code's own `self`/`cls` is flagged, as is importing a private module (`from urllib3._x import ...`).
Dunders (`__name__`) are public.
"""

import ast
from pathlib import Path

import pytest

LOADGEN = Path(__file__).resolve().parents[2] / "loadgen"
SOURCES = sorted(LOADGEN.glob("*.py"))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str) -> list[str]:
    """`line: text` for each private attribute or module the source reaches outside its own objects."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                "getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and _private(name.value):
                found.append(f"{node.lineno}: {node.func.id}(..., {name.value!r})")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if any(_private(part) for part in node.module.split(".")) or any(_private(a.name) for a in node.names):
                found.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names
                      if any(_private(part) for part in a.name.split("."))]
    return sorted(found, key=lambda text: int(text.split(":")[0]))


def test_the_scan_sees_every_form_of_private_use():
    source = """
import urllib3._collections
from gevent._socket3 import socket
from requests import _internal_utils
conn.sock._sock.recv_into(buf)
getattr(hub, "_loop")
self._ok = 1
x.__class__
"""
    assert private_uses(source) == ["2: import urllib3._collections", "3: from gevent._socket3 import ...",
                                    "4: from requests import ...", "5: ._sock", "6: getattr(..., '_loop')"]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_loadgen_uses_no_private_attribute(path):
    assert private_uses(path.read_text()) == []
