"""Fixtures for the load generator tests: the mock SSE server in a thread, locust as a subprocess."""

import os

# Importing locust monkey-patches the whole pytest process (threads become greenlets); the in-process
# tests only need its classes. Subprocess runs get a clean environment without this variable.
os.environ.setdefault("LOCUST_SKIP_MONKEY_PATCH", "1")

import pytest  # noqa: E402

from loadgen.mockserver import MockConfig, MockServer  # noqa: E402


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
