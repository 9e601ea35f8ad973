"""Runs the app under uvicorn with our own SIGTERM drain and a non-zero exit when the engine dies."""

import asyncio
import signal
import socket
import sys
import time

import uvicorn

from engine.server.app import create_app
from engine.server.builder import start_state, stop_state
from engine.server.state import AbortReason, ServerState

DEAD_POLL_S = 0.2
GRACEFUL_CLOSE_S = 5.0
SHUTDOWN_CLOSE_S = 2.0  # after a second signal: time for the aborted requests' answers to go out


class LLMServer(uvicorn.Server):
    """uvicorn's Server whose first SIGTERM/SIGINT drains instead of stopping at once.

    Drain: readiness turns false (new completions get 503), running requests may finish until
    the drain timeout, the rest are aborted (an error event, then [DONE]), then uvicorn stops.
    A second signal stops at once: what is still running is aborted as `shutdown` (its client gets
    the error event), counted in engine.shutdown, and the server closes when those answers are
    out (a third signal does not wait for them). No signal is re-raised afterwards: the exit is 0.
    """

    def __init__(self, config: uvicorn.Config, state: ServerState):
        super().__init__(config)
        self.state = state
        self.exit_reason: str | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        self._drain_task: asyncio.Task | None = None
        self._stopping = False

    def handle_exit(self, sig: int, frame) -> None:
        if self.loop is None:
            self.should_exit = True
            return
        if not self.state.draining:
            self.exit_reason = "sigint" if sig == signal.SIGINT else "sigterm"
        self.loop.call_soon_threadsafe(self.stop_now if self.state.draining else self.begin_drain)

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2] if self.servers else (self.config.host,
                                                                                            self.config.port)
            shown = f"[{host}]" if ":" in str(host) else host
            print(f"llmserve: listening on http://{shown}:{port} (model {self.state.model_name})",
                  file=sys.stderr, flush=True)

    def begin_drain(self) -> None:
        if self.state.draining:
            return
        self.state.draining = True
        self.state.num_drain_live = len(self.state.live)
        self.exit_reason = self.exit_reason or "sigterm"
        self._drain_task = self._spawn(self._drain())

    def stop_now(self) -> None:
        """A second signal: abort what still runs (reason `shutdown`) and close once they are answered."""
        if self._stopping:
            self.should_exit = self.force_exit = True
            return
        self._stopping = True
        if self._drain_task is not None:
            self._drain_task.cancel()
        state = self.state
        remaining = list(state.live)
        for request_id in remaining:
            state.abort(request_id, AbortReason.SHUTDOWN)
        state.num_drain_aborted = len(remaining)
        state.num_drained = max(state.num_drain_live - len(remaining), 0)
        self._spawn(self._close_when_answered())

    async def _close_when_answered(self) -> None:
        end = time.monotonic() + SHUTDOWN_CLOSE_S
        while self.state.live and time.monotonic() < end:
            await asyncio.sleep(0.02)
        self.should_exit = True
        self.force_exit = bool(self.state.live)  # a wedged step: do not wait on its requests

    def on_fatal(self) -> None:
        """Called from the step thread when the engine dies: stop serving, exit non-zero."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._fatal)

    def _fatal(self) -> None:
        if self.exit_reason != "fatal":
            self.exit_reason = "fatal"
            self.state.fatal = True
            self.should_exit = True

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _drain(self) -> None:
        state = self.state
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
        state.num_drained = state.num_drain_live - len(remaining)
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
