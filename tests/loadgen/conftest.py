"""Fixtures for the load generator tests: the mock SSE server in a thread, locust as a subprocess."""

import os

# Importing locust monkey-patches the whole pytest process (threads become greenlets); the in-process
# tests only need its classes. Subprocess runs get a clean environment without this variable.
os.environ.setdefault("LOCUST_SKIP_MONKEY_PATCH", "1")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from loadgen.mockserver import MockConfig, MockServer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LOCUST = Path(sys.executable).parent / "locust"


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


def run_locust(args: list[str], cwd: Path, timeout_s: float = 90) -> subprocess.CompletedProcess:
    """`locust -f loadgen/chat.py --headless ...`; returns the finished process (output in .stdout)."""
    env = {k: v for k, v in os.environ.items() if k != "LOCUST_SKIP_MONKEY_PATCH"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [str(LOCUST), "-f", str(REPO / "loadgen" / "chat.py"), "--headless", "--only-summary",
           "--stop-timeout", "10", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)


def read_summary(report_dir: Path) -> dict:
    return json.loads((report_dir / "loadgen_summary.json").read_text())
