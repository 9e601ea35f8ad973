"""Runs the app under uvicorn with our own SIGTERM drain and a non-zero exit when the engine dies."""

import asyncio
import socket
import time

import uvicorn

from engine.server.app import create_app
from engine.server.builder import start_state, stop_state
from engine.server.state import AbortReason, ServerState

DEAD_POLL_S = 0.2
GRACEFUL_CLOSE_S = 5.0


class LLMServer(uvicorn.Server):
    """uvicorn's Server whose first SIGTERM/SIGINT drains instead of stopping at once.

    Drain: readiness turns false (new completions get 503), running requests may finish until
    the drain timeout, the rest are aborted (an error event, then [DONE]), then uvicorn stops.
    A second signal stops at once. The signal is not re-raised afterwards, so the exit is 0.
    """

    def __init__(self, config: uvicorn.Config, state: ServerState):
        super().__init__(config)
        self.state = state
        self.exit_reason: str | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()

    def handle_exit(self, sig: int, frame) -> None:
        if self.state.draining or self.loop is None:
            self.should_exit = True
            self.force_exit = self.state.draining
            return
        self.loop.call_soon_threadsafe(self.begin_drain)

    def begin_drain(self) -> None:
        if self.state.draining:
            return
        self.state.draining = True
        self.exit_reason = "sigterm"
        self._spawn(self._drain())

    def on_fatal(self) -> None:
        """Called from the step thread when the engine dies: stop serving, exit non-zero."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._fatal)

    def _fatal(self) -> None:
        if self.exit_reason != "fatal":
            self.exit_reason = "fatal"
            self.state.fatal = True
            self.should_exit = True

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self) -> None:
        state = self.state
        num_live = len(state.live)
        deadline = time.monotonic() + state.config.drain_timeout_s
        while state.live and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        remaining = list(state.live)
        for request_id in remaining:
            state.abort(request_id, AbortReason.DRAIN)
        end = time.monotonic() + GRACEFUL_CLOSE_S
        while state.live and time.monotonic() < end:
            await asyncio.sleep(0.02)
        state.num_drain_aborted = len(remaining)
        state.num_drained = num_live - len(remaining)
        self.should_exit = True

    async def _watch_dead(self) -> None:
        while not self.should_exit:
            if self.state.engine.is_dead:
                self._fatal()
            await asyncio.sleep(DEAD_POLL_S)

    async def serve(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        self.state.on_fatal = self.on_fatal
        self._spawn(self._watch_dead())
        await super().serve(sockets)


def make_server(state: ServerState, host: str, port: int, sock: socket.socket | None = None) -> LLMServer:
    config = uvicorn.Config(create_app(state), host=host, port=port, log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=GRACEFUL_CLOSE_S, log_config=None)
    return LLMServer(config, state)


def bind(host: str, port: int) -> socket.socket:
    """Bind the listening socket before the (slow) engine load, so a taken port fails at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def serve(state: ServerState, sock: socket.socket) -> int:
    """Start the engine, serve until drained or dead; the exit code (0 drained, 1 engine died)."""
    host, port = sock.getsockname()[:2]
    server = make_server(state, host, port)
    start_state(state)
    try:
        server.run(sockets=[sock])
    finally:
        stop_state(state, "fatal" if state.fatal else server.exit_reason or "sigterm")
    return 1 if state.fatal else 0
