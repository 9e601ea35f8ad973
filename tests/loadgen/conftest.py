"""Fixtures for the load generator tests: the mock SSE server in a thread, locust as a subprocess."""

import os

# Importing locust monkey-patches the whole pytest process (threads become greenlets); the in-process
# tests only need its classes. So it is imported once here with patching off, then the variable goes:
# other tests' subprocesses (game days run Locust) must not inherit it.
os.environ["LOCUST_SKIP_MONKEY_PATCH"] = "1"
import locust  # noqa: E402, F401

del os.environ["LOCUST_SKIP_MONKEY_PATCH"]

import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
import requests  # noqa: E402
from locust.clients import HttpSession  # noqa: E402
from locust.event import EventHook  # noqa: E402

from loadgen.mockserver import MockConfig, MockServer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def user_session(url: str, events: list | None = None) -> HttpSession:
    """Locust's HttpSession for url; each request event it fires goes into events."""
    hook = EventHook()
    if events is not None:
        hook.add_listener(lambda **kw: events.append(kw))
    return HttpSession(url, request_event=hook, user=None)


@pytest.fixture
def mock_server():
    """Factory: start a MockServer with the given config; all are stopped at teardown."""
    servers: list[MockServer] = []

    def start(**kwargs) -> MockServer:
        server = MockServer(MockConfig(**kwargs))
        server.start_in_thread()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


class MockProcess:
    """The mock server in its own process: its timing never waits for this process's GIL."""

    def __init__(self, ttft_s: float, itl_s: float, faults: tuple[str, ...] = ("ok",)):
        argv = [sys.executable, "-m", "loadgen.mockserver", "--port", "0", "--ttft-ms", str(ttft_s * 1000),
                "--itl-ms", str(itl_s * 1000), "--faults", ",".join(faults)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO)
        line = self.proc.stdout.readline()  # "mockserver listening on http://127.0.0.1:PORT"
        self.port = int(line.rsplit(":", 1)[1])

    @property
    def stats(self) -> SimpleNamespace:
        return SimpleNamespace(**requests.get(f"http://127.0.0.1:{self.port}/stats", timeout=10).json())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def mock_process():
    """Factory: start the mock server as a subprocess (for timing-exact end-to-end runs)."""
    procs: list[MockProcess] = []

    def start(**kwargs) -> MockProcess:
        procs.append(MockProcess(**kwargs))
        return procs[-1]

    yield start
    for proc in procs:
        proc.stop()
