"""loadgen/ reaches gevent, urllib3, requests and http.client through their public APIs only.

Any `x._name` attribute (or getattr/setattr with a `_name` string) on something that is not the
code's own `self`/`cls` is flagged, as is importing a private module (`from urllib3._x import ...`).
Dunders (`__name__`) are public.

The sources are parsed with the cyclic collector off (`parse`). Python 3.11 counts the AST
constructor's recursion in one counter per interpreter, set at the start of each conversion and
checked at its end ("AST constructor recursion depth mismatch", a SystemError). A collection during
the conversion runs finalizers (a closed socket's file object closes in Python code), which lets
another thread run, and a thread that parses in that time resets the counter: here, HTTP handler
threads of earlier tests' servers still ending, whose traceback printing parses each line for its
carets in 3.11. With the collector off the conversion runs no Python code, so nothing comes between.
"""

import ast
import gc
import threading
from pathlib import Path

import pytest

LOADGEN = Path(__file__).resolve().parents[2] / "loadgen"
SOURCES = sorted(LOADGEN.glob("*.py"))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def parse(source: str) -> ast.Module:
    """ast.parse, with no collection (and so no other thread's parse) during its conversion."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if enabled:
            gc.enable()


def private_uses(source: str) -> list[str]:
    """`line: text` for each private attribute or module the source reaches outside its own objects."""
    found = []
    for node in ast.walk(parse(source)):
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


def test_the_scan_parses_while_other_threads_parse():
    """A thread parsing all along and Python code in every collection (what made ast.parse raise
    SystemError under load): the scan's parse still succeeds every time."""
    stop = threading.Event()

    def parse_lines():
        while not stop.is_set():
            ast.parse("a + b")

    def in_collection(phase, info):
        sum(range(100))

    source = max(SOURCES, key=lambda p: p.stat().st_size).read_text()
    gc.callbacks.append(in_collection)
    thread = threading.Thread(target=parse_lines)
    thread.start()
    try:
        results = [private_uses(source) for _ in range(100)]
    finally:
        stop.set()
        thread.join()
        gc.callbacks.remove(in_collection)
    assert results == [private_uses(source)] * 100
