"""The llm-gpu-exporter command: argument parsing, HTTP serving, signal handling and clean NVML shutdown."""

from __future__ import annotations

import argparse
import logging
import math
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, start_http_server

from exporters.collector import GpuCollector
from exporters.nvml import BindingMissingError, Nvml, NvmlSession, load_nvml
from exporters.xid import XidWatcher

PROG = "llm-gpu-exporter"
DESCRIPTION = """Serve NVIDIA GPU metrics, read through NVML at every scrape, in Prometheus text format.

Without an NVML library or GPU it still serves /metrics with llm_gpu_nvml_up 0 and retries
initialisation every --nvml-retry-interval seconds. SIGTERM shuts NVML down and exits 0.

example:
  llm-gpu-exporter --host 127.0.0.1 --port 9400
  curl -s http://127.0.0.1:9400/metrics | grep -E '^llm_gpu_(nvml_)?up'
"""

log = logging.getLogger(PROG)


class UsageError(Exception):
    """A bad command-line argument."""


@dataclass(slots=True)
class ExporterConfig:
    host: str = "127.0.0.1"
    port: int = 9400
    nvml_retry_interval_s: float = 30.0
    process_metrics: bool = True
    xid_wait_ms: int = 1000
    nvml_timeout_s: float = 5.0
    log_level: str = "info"


class OneLineArgumentParser(argparse.ArgumentParser):
    """Raises UsageError instead of printing usage, so main() reports one line and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} out of range 0-65535")
    return port


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _positive_ms(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of milliseconds: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 ms, got {value}")
    return value


def parse_args(argv: list[str] | None) -> ExporterConfig:
    parser = OneLineArgumentParser(
        prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=_port, default=9400, help="port to listen on (default 9400; 0 picks one)"
    )
    parser.add_argument(
        "--nvml-retry-interval",
        type=_positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="while NVML is unavailable, retry nvmlInit this often (default 30)",
    )
    parser.add_argument(
        "--no-process-metrics",
        action="store_true",
        help="omit llm_gpu_process_memory_used_bytes (one series per GPU process)",
    )
    parser.add_argument(
        "--xid-wait-ms",
        type=_positive_ms,
        default=1000,
        metavar="MS",
        help="XID event thread's nvmlEventSetWait timeout (default 1000)",
    )
    parser.add_argument(
        "--nvml-timeout",
        type=_positive_seconds,
        default=5.0,
        metavar="SECONDS",
        help="longest a scrape waits for NVML before serving llm_gpu_nvml_up 0 (default 5)",
    )
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    args = parser.parse_args(argv)
    return ExporterConfig(
        host=args.host,
        port=args.port,
        nvml_retry_interval_s=args.nvml_retry_interval,
        process_metrics=not args.no_process_metrics,
        xid_wait_ms=args.xid_wait_ms,
        nvml_timeout_s=args.nvml_timeout,
        log_level=args.log_level,
    )


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    formatter = logging.Formatter(
        "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s", datefmt="%Y-%m-%dT%H:%M:%S"
    )
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    log.handlers[:] = [handler]
    log.setLevel(level.upper())
    log.propagate = False


def run(config: ExporterConfig, nvml: Nvml, stop: threading.Event | None = None) -> int:
    """Serve until `stop` is set (SIGTERM/SIGINT set it); return the exit code."""
    stop = stop or threading.Event()
    session = NvmlSession(nvml, retry_interval_s=config.nvml_retry_interval_s)
    session.ensure_up()
    watcher = XidWatcher(session, wait_ms=config.xid_wait_ms)
    registry = CollectorRegistry()
    registry.register(
        GpuCollector(
            session, watcher, process_metrics=config.process_metrics, read_timeout_s=config.nvml_timeout_s
        )
    )
    try:
        httpd, _ = start_http_server(config.port, addr=config.host, registry=registry)
    except socket.gaierror as exc:
        log.error("invalid --host %r: %s", config.host, exc.strerror)
        session.shutdown()
        return 2
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", config.host, config.port, exc.strerror or exc)
        session.shutdown()
        return 1
    watcher.start()
    host, port = httpd.server_address[:2]
    log.info("serving http://%s:%d/metrics", host, port)
    while not stop.wait(0.5):
        pass
    log.info("shutting down")
    httpd.shutdown()
    httpd.server_close()
    watcher.stop()
    closer = threading.Thread(target=session.shutdown, name="nvml-shutdown", daemon=True)
    closer.start()
    closer.join(10.0)
    if closer.is_alive():  # a wedged driver: exiting matters more than a clean nvmlShutdown
        log.error("nvmlShutdown did not return within 10s; exiting anyway")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_args(argv)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    _setup_logging(config.log_level)
    try:
        nvml = load_nvml()
    except BindingMissingError as exc:
        log.error("%s", exc)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return run(config, nvml, stop)


if __name__ == "__main__":
    sys.exit(main())
