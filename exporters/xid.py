"""XID watcher: an NVML event thread counting XID critical errors by GPU and code, with last-seen times."""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from exporters.nvml import ErrorKind, NvmlSession, classify, error_text

log = logging.getLogger("llm-gpu-exporter")

MAX_BACKOFF_S = 30.0


@dataclass(slots=True)
class XidRecord:
    gpu_labels: tuple[str, str, str]  # gpu index, uuid, name
    xid: int
    count: int
    last_seen_ts: float  # unix time (a Prometheus timestamp, so wall clock)


def _handle_key(handle: object) -> int:
    """The address behind an NVML device handle (a ctypes pointer); object identity for a fake."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


class XidWatcher:
    """Registers every GPU for nvmlEventTypeXidCriticalError and waits on the event set in its own thread.

    Counts live here, outside the scrape, so they survive failing collections. The event set is
    rebuilt whenever the session's generation changes (NVML re-initialised).
    """

    def __init__(
        self, session: NvmlSession, wait_ms: int = 1000, wall_clock: Callable[[], float] = time.time
    ):
        self._session = session
        self._wait_ms = wait_ms
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._records: dict[tuple[tuple[str, str, str], int], XidRecord] = {}
        self._event_set: object | None = None
        self._generation = 0
        self._handle_to_gpu: dict[int, tuple[str, str, str]] = {}
        self._uuid_to_gpu: dict[str, tuple[str, str, str]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def healthy(self) -> bool:
        """True while an event set is registered for the current NVML generation."""
        return (
            self._event_set is not None and self._session.up and self._generation == self._session.generation
        )

    @property
    def num_registered(self) -> int:
        return len(self._handle_to_gpu)

    def records(self) -> list[XidRecord]:
        with self._lock:
            return [XidRecord(r.gpu_labels, r.xid, r.count, r.last_seen_ts) for r in self._records.values()]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="xid-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._teardown()

    def _run(self) -> None:
        backoff_s = 1.0
        while not self._stop.is_set():
            try:
                waited = self.poll_once()
                backoff_s = 1.0
            except Exception as exc:  # noqa: BLE001 - the thread must outlive whatever NVML throws
                log.warning("XID watcher: %s; retrying in %gs", error_text(exc), backoff_s)
                self._teardown()
                self._stop.wait(backoff_s)
                backoff_s = min(backoff_s * 2, MAX_BACKOFF_S)
                continue
            if not waited:  # NVML down or nothing registered: the session paces the init retries
                self._stop.wait(self._wait_ms / 1000.0)

    def poll_once(self) -> bool:
        """One step: (re)register if needed, wait up to wait_ms for one event. True if it waited."""
        session = self._session
        nvml = session.nvml
        if not session.ensure_up():
            self._teardown()
            return False
        if self._event_set is None or self._generation != session.generation:
            self._teardown()
            try:
                self._register(session.generation)
            except nvml.NVMLError as exc:
                self._lifecycle(exc, "registering XID events")
                return False
        if not self._handle_to_gpu:
            return False
        try:
            data = nvml.nvmlEventSetWait(self._event_set, self._wait_ms)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                return True
            self._lifecycle(exc, "nvmlEventSetWait")
            return False
        self._record(data)
        return True

    def _lifecycle(self, exc: BaseException, where: str) -> None:
        """A failure of the event set as a whole: drop it; tell the session if NVML or a GPU went away."""
        generation = self._generation
        self._teardown()
        if generation != self._session.generation:
            return  # NVML was re-initialised under us: the set was stale, re-register next time
        kind = classify(self._session.nvml, exc)
        if kind is ErrorKind.NVML_GONE:
            self._session.mark_down(f"{where}: {error_text(exc)}", generation)
        elif kind is ErrorKind.GPU_LOST:
            self._session.request_reinit(f"{where}: {error_text(exc)}", generation)
        else:
            raise exc

    def _register(self, generation: int) -> None:
        nvml = self._session.nvml
        xid_type = nvml.nvmlEventTypeXidCriticalError
        self._event_set = nvml.nvmlEventSetCreate()
        self._generation = generation
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                gpu = (str(index), str(nvml.nvmlDeviceGetUUID(handle)), str(nvml.nvmlDeviceGetName(handle)))
                if not nvml.nvmlDeviceGetSupportedEventTypes(handle) & xid_type:
                    log.info("GPU %d does not report XID events", index)
                    continue
                nvml.nvmlDeviceRegisterEvents(handle, xid_type, self._event_set)
            except nvml.NVMLError as exc:
                if classify(nvml, exc) is ErrorKind.NVML_GONE:
                    raise
                log.warning("GPU %d: cannot register XID events: %s", index, error_text(exc))
                continue
            self._handle_to_gpu[_handle_key(handle)] = gpu
            self._uuid_to_gpu[gpu[1]] = gpu

    def _record(self, data: object) -> None:
        nvml = self._session.nvml
        if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
            return
        gpu = self._handle_to_gpu.get(_handle_key(data.device))
        if gpu is None:  # not the handle we registered: ask its UUID (may fail on a lost GPU)
            try:
                uuid = str(nvml.nvmlDeviceGetUUID(data.device))
                gpu = self._uuid_to_gpu.get(uuid, ("", uuid, ""))
            except nvml.NVMLError:
                gpu = ("", "", "")
        xid = int(data.eventData)
        now = self._wall_clock()
        with self._lock:
            record = self._records.get((gpu, xid))
            if record is None:
                record = self._records[(gpu, xid)] = XidRecord(gpu, xid, 0, now)
            record.count += 1
            record.last_seen_ts = now
        log.error("XID %d on GPU %s (%s)", xid, gpu[0], gpu[1])

    def _teardown(self) -> None:
        event_set, self._event_set = self._event_set, None
        self._handle_to_gpu = {}
        self._uuid_to_gpu = {}
        if event_set is None:
            return
        try:
            self._session.nvml.nvmlEventSetFree(event_set)
        except self._session.nvml.NVMLError as exc:
            log.debug("nvmlEventSetFree: %s", error_text(exc))
