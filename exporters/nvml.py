"""NVML behind a thin interface: loading the binding, classifying its errors, the init/re-init lifecycle."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

log = logging.getLogger("llm-gpu-exporter")

# The "NVML object" is anything exposing pynvml's function names, constants and error classes:
# the real `pynvml` module in production, a fake in tests. Nothing here imports pynvml itself.
Nvml = Any


class BindingMissingError(RuntimeError):
    """The Python binding (package nvidia-ml-py, module pynvml) cannot be imported."""


def load_nvml() -> Nvml:
    """Return the real binding; raises BindingMissingError when nvidia-ml-py is not installed."""
    try:
        import pynvml
    except ImportError as exc:
        raise BindingMissingError(
            f"python module pynvml not importable ({exc}); install nvidia-ml-py"
        ) from exc
    return pynvml


class ErrorKind(Enum):
    ABSENT = "absent"  # the GPU or driver lacks this field: omit it, not a failure
    FIELD = "field"  # this read failed (permissions, no data...): omit it, the collector failed
    GPU_LOST = "gpu_lost"  # this GPU is gone or wedged: mark it down, re-init NVML
    NVML_GONE = "nvml_gone"  # the library or driver is gone: everything down, re-init NVML


_ABSENT_CODES = ("NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "DEPRECATED", "ARGUMENT_VERSION_MISMATCH")
_GPU_LOST_CODES = ("GPU_IS_LOST", "GPU_NOT_FOUND", "RESET_REQUIRED", "UNKNOWN")
_NVML_GONE_CODES = ("UNINITIALIZED", "DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH", "LIBRARY_NOT_FOUND")


def _codes(nvml: Nvml, names: tuple[str, ...]) -> frozenset[int]:
    return frozenset(getattr(nvml, "NVML_ERROR_" + n) for n in names if hasattr(nvml, "NVML_ERROR_" + n))


def classify(nvml: Nvml, exc: BaseException) -> ErrorKind:
    """Sort an NVML error into what the exporter does about it (reference section 3.3)."""
    code = getattr(exc, "value", None)
    if code in _codes(nvml, _ABSENT_CODES):
        return ErrorKind.ABSENT
    if code in _codes(nvml, _GPU_LOST_CODES):
        return ErrorKind.GPU_LOST
    if code in _codes(nvml, _NVML_GONE_CODES):
        return ErrorKind.NVML_GONE
    return ErrorKind.FIELD


def error_text(exc: BaseException) -> str:
    """NVML's own wording for an error, never raising (str() of an unknown code calls into NVML)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - str() of an NVMLError may call a missing library
        text = ""
    code = getattr(exc, "value", None)
    return f"{text} (code {code})" if code is not None else text or type(exc).__name__


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version integer (12040) as "12.4"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


class NvmlSession:
    """Owns nvmlInit/nvmlShutdown: first init, periodic retry while down, re-init after a loss.

    `generation` increases at every successful init, so holders of handles or event sets (the
    XID watcher) know to drop them. Thread-safe: the scrape and the XID thread both call it.
    """

    def __init__(
        self, nvml: Nvml, retry_interval_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ):
        self.nvml = nvml
        self.retry_interval_s = retry_interval_s
        self._clock = clock
        self._lock = threading.RLock()
        self.up = False
        self.generation = 0
        self.last_error: str | None = None
        self.num_init_attempts = 0
        self.num_init_failures = 0
        self._last_attempt_ts: float | None = None
        self._reinit_reason: str | None = None
        self._logged_error: str | None = None
        self.versions: dict[str, str] = {}

    def ensure_up(self) -> bool:
        """Init NVML if it is down and a retry is due, or re-init if one was requested; return up."""
        with self._lock:
            if self._reinit_reason is not None:
                reason, self._reinit_reason = self._reinit_reason, None
                log.warning("re-initialising NVML after: %s", reason)
                self._shutdown_quietly()
                self._init()
            elif not self.up and self._retry_due():
                self._init()
            return self.up

    def request_reinit(self, reason: str, generation: int) -> None:
        """A GPU was lost: shut down and re-init at the next ensure_up(), at most once per retry interval.

        `generation` is the one the caller's handles came from; a stale caller changes nothing.
        """
        with self._lock:
            if not self.up or generation != self.generation or self._reinit_reason is not None:
                return
            if not self._retry_due():  # a GPU that stays lost must not re-init NVML at every scrape
                log.debug("re-init after %r deferred: last init under %gs ago", reason, self.retry_interval_s)
                return
            self._reinit_reason = reason

    def mark_down(self, reason: str, generation: int) -> None:
        """The library or driver went away mid-use: down now, first retry at the next ensure_up()."""
        with self._lock:
            if not self.up or generation != self.generation:
                return
            log.error("NVML lost: %s; serving llm_gpu_nvml_up 0 and retrying", reason)
            self._shutdown_quietly()
            self.up = False
            self.last_error = reason
            self._logged_error = reason
            self._last_attempt_ts = None

    def shutdown(self) -> None:
        """Clean shutdown (SIGTERM)."""
        with self._lock:
            if self.up:
                self._shutdown_quietly()
                self.up = False
                log.info("NVML shut down")

    def _retry_due(self) -> bool:
        if self._last_attempt_ts is None:
            return True
        return self._clock() - self._last_attempt_ts >= self.retry_interval_s

    def _init(self) -> None:
        self._last_attempt_ts = self._clock()
        self.num_init_attempts += 1
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            self._init_failed(error_text(exc))
            return
        self.up = True
        self.generation += 1
        self.last_error = None
        self._logged_error = None
        self.versions = self._read_versions()
        log.info(
            "NVML initialised: driver %s, NVML %s, CUDA %s",
            self.versions.get("driver_version", "?"),
            self.versions.get("nvml_version", "?"),
            self.versions.get("cuda_driver_version", "?"),
        )

    def _init_failed(self, reason: str) -> None:
        self.up = False
        self.num_init_failures += 1
        self.last_error = reason
        if reason != self._logged_error:  # one line per distinct cause, not one per retry
            log.error(
                "NVML unavailable: %s; serving llm_gpu_nvml_up 0, retrying every %gs",
                reason,
                self.retry_interval_s,
            )
            self._logged_error = reason

    def _read_versions(self) -> dict[str, str]:
        readers = {
            "driver_version": lambda: str(self.nvml.nvmlSystemGetDriverVersion()),
            "nvml_version": lambda: str(self.nvml.nvmlSystemGetNVMLVersion()),
            "cuda_driver_version": lambda: cuda_version_text(self.nvml.nvmlSystemGetCudaDriverVersion()),
        }
        versions: dict[str, str] = {}
        for key, read in readers.items():
            try:
                versions[key] = read()
            except self.nvml.NVMLError as exc:
                log.warning("cannot read %s: %s", key, error_text(exc))
        return versions

    def _shutdown_quietly(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", error_text(exc))
