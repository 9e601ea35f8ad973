"""Runs a real llmserve (builtin model, real engine) in-process on a free loopback port for tests."""

import json
import socket
import threading
import time
from dataclasses import dataclass, field

import httpx
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from engine.core.config import EngineConfig
from engine.core.faults import FaultConfig
from engine.obs.logs import EventLogger, LogFormat
from engine.obs.tracing import make_tracer_provider
from engine.server.builder import build_state, load_engine, start_state, stop_state
from engine.server.runner import make_server
from engine.server.state import ServerConfig


class LogCapture:
    """A text stream keeping every line written to it."""

    def __init__(self):
        self._lock = threading.Lock()
        self.lines: list[str] = []

    def write(self, text: str) -> int:
        with self._lock:
            self.lines.extend(line for line in text.splitlines() if line)
        return len(text)

    def flush(self) -> None:
        pass

    def events(self, name: str | None = None) -> list[dict]:
        with self._lock:
            records = [json.loads(line) for line in self.lines]
        return [r for r in records if name is None or r["event"] == name]


@dataclass
class Harness:
    url: str
    state: object
    server: object
    thread: threading.Thread
    logs: LogCapture
    spans: InMemorySpanExporter | None = None
    client: httpx.Client = field(default=None)

    def scrape(self) -> str:
        return self.client.get("/metrics").text

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples called `name` whose labels include `labels`."""
        total, found = 0.0, False
        for family in text_string_to_metric_families(self.scrape()):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total, found = total + sample.value, True
        if not found:
            raise KeyError(f"no sample {name} {labels}")
        return total

    def wait_for(self, predicate, timeout_s: float = 20.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}")

    def stop(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=20)
        stop_state(self.state, "sigterm")


def start_server(engine_kw: dict | None = None, server_kw: dict | None = None, traces: bool = False,
                 faults: FaultConfig | None = None) -> Harness:
    logs = LogCapture()
    log = EventLogger("builtin", logs, LogFormat.JSON)
    engine_config = EngineConfig(**{"max_model_len": 512, "num_kv_blocks": 256, **(engine_kw or {})})
    engine_config.faults = faults
    llm = load_engine(engine_config, log)
    spans = InMemorySpanExporter() if traces else None
    provider = make_tracer_provider(processor=SimpleSpanProcessor(spans)) if traces else None
    state = build_state(llm, ServerConfig(**(server_kw or {})), log, provider)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = make_server(state, "127.0.0.1", port)
    start_state(state)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    harness = Harness(url, state, server, thread, logs, spans, httpx.Client(base_url=url, timeout=30))
    harness.wait_for(lambda: server.started, what="server start")
    return harness
