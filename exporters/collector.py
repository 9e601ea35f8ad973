"""The prometheus_client Collector: reads NVML at every scrape, one GPU or one field failing never fails it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from exporters.families import Families
from exporters.fields import DEVICE_FIELDS, PROCESS_FIELD, Field, Sample
from exporters.nvml import ErrorKind, NvmlSession, classify, error_text
from exporters.xid import XidWatcher

log = logging.getLogger("llm-gpu-exporter")


@dataclass(slots=True, frozen=True)
class GpuIdentity:
    index: int
    uuid: str
    name: str

    @property
    def labels(self) -> tuple[str, str, str]:
        return (str(self.index), self.uuid, self.name)


@dataclass(slots=True)
class CollectorStat:
    duration_s: float = 0.0
    success: bool = True


@dataclass(slots=True)
class ScrapeResult:
    """What one pass over the GPUs produced, committed to the families only if NVML stayed up."""

    samples: list[tuple[GpuIdentity, Sample]] = field(default_factory=list)
    gpu_up: dict[str, tuple[GpuIdentity, bool]] = field(default_factory=dict)  # uuid or "#index" -> state


class NvmlGoneError(Exception):
    """The library or driver went away during the scrape."""


class GpuLostError(Exception):
    """One GPU stopped answering during the scrape."""


@dataclass(slots=True)
class InflightRead:
    """One NVML read running in its own thread, so a wedged driver cannot hang the scrape."""

    started_ts: float
    done: threading.Event = field(default_factory=threading.Event)
    result: Families | None = None
    error: BaseException | None = None


class GpuCollector:
    """Custom collector: register with a CollectorRegistry; `collect()` runs at every scrape.

    With `read_timeout_s`, NVML is read in a worker thread; a read that has not returned in time
    (a driver stuck in D-state) yields llm_gpu_nvml_up 0 and every known GPU down, and later scrapes
    wait on that same read rather than piling up new ones.
    """

    def __init__(
        self,
        session: NvmlSession,
        xid: XidWatcher | None = None,
        process_metrics: bool = True,
        timer: Callable[[], float] = time.perf_counter,
        read_timeout_s: float | None = None,
    ):
        self._session = session
        self.read_timeout_s = read_timeout_s
        self._inflight: InflightRead | None = None
        self._guard_lock = threading.Lock()
        self._xid = xid
        self._fields: tuple[Field, ...] = DEVICE_FIELDS + ((PROCESS_FIELD,) if process_metrics else ())
        self._timer = timer
        self._known: dict[str, GpuIdentity] = {}  # uuid -> last identity: a vanished GPU stays visible, down
        self._absent: set[tuple[str, str]] = set()  # (uuid, field key) NotSupported in this NVML generation
        self._absent_generation = 0
        self._scrape_generation = 0  # the NVML generation the current scrape's handles belong to
        self._logged: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()
        self._logged_hang: float | None = None  # started_ts of the read last reported as hung

    def collect(self) -> Iterator[Metric]:
        if self.read_timeout_s is None:
            with (
                self._lock
            ):  # the HTTP server is threaded; scrapes share the known-GPU and NotSupported state
                families = self._collect_locked()
        else:
            families = self._collect_guarded(self.read_timeout_s)
        yield from families

    def _collect_guarded(self, timeout_s: float) -> Families:
        with self._guard_lock:
            read = self._inflight
            if read is None or read.done.is_set():
                read = self._inflight = InflightRead(time.monotonic())
                threading.Thread(target=self._read_into, args=(read,), name="nvml-read", daemon=True).start()
        if not read.done.wait(timeout_s):
            return self._hung_families(time.monotonic() - read.started_ts)
        if read.error is not None:
            raise read.error
        assert read.result is not None
        return read.result

    def _read_into(self, read: InflightRead) -> None:
        try:
            with self._lock:
                read.result = self._collect_locked()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting scrape
            read.error = exc
        finally:
            if self._logged_hang and read.started_ts == self._logged_hang:
                log.warning("NVML answered again after %.1fs", time.monotonic() - read.started_ts)
            read.done.set()

    def _hung_families(self, waited_s: float) -> Families:
        read = self._inflight
        if read is not None and self._logged_hang != read.started_ts:
            self._logged_hang = read.started_ts
            log.error(
                "NVML has not answered for %.1fs (a wedged driver?); serving llm_gpu_nvml_up 0 until it does",
                waited_s,
            )
        families = Families()
        for gpu in sorted(list(self._known.values()), key=lambda g: (g.index, g.uuid)):
            families.add("llm_gpu_up", gpu.labels, 0.0)
        families.add("llm_gpu_nvml_up", (), 0.0)
        families.add("llm_gpu_collector_success", ("nvml",), 0.0)
        families.add("llm_gpu_collector_duration_seconds", ("nvml",), waited_s)
        self._add_xid(families)
        return families

    def _collect_locked(self) -> Families:
        start = self._timer()
        for _ in range(2):  # once more if NVML was re-initialised (by the XID thread) under this scrape
            stats, result = self._read_all()
            if self._session.generation == self._scrape_generation:
                break
        stats["nvml"].success = self._session.up
        stats["nvml"].duration_s = self._timer() - start - sum(s.duration_s for s in stats.values())
        families = Families()
        self._add_gpus(families, result)
        self._add_health(families, stats)
        self._add_xid(families)
        return families

    def _read_all(self) -> tuple[dict[str, CollectorStat], ScrapeResult]:
        stats: dict[str, CollectorStat] = {"nvml": CollectorStat()}
        up = self._session.ensure_up()
        generation = self._scrape_generation = self._session.generation
        if not up:
            return stats, ScrapeResult()
        try:
            return stats, self._collect_gpus(stats)
        except NvmlGoneError as exc:
            self._session.mark_down(str(exc), generation)
            return stats, ScrapeResult()

    def _collect_gpus(self, stats: dict[str, CollectorStat]) -> ScrapeResult:
        nvml = self._session.nvml
        if self._absent_generation != self._session.generation:
            self._absent.clear()
            self._absent_generation = self._session.generation
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            raise NvmlGoneError(f"nvmlDeviceGetCount: {error_text(exc)}") from exc
        result = ScrapeResult()
        for index in range(count):
            self._collect_gpu(index, result, stats)
        return result

    def _collect_gpu(self, index: int, result: ScrapeResult, stats: dict[str, CollectorStat]) -> None:
        nvml = self._session.nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpu = GpuIdentity(index, str(nvml.nvmlDeviceGetUUID(handle)), str(nvml.nvmlDeviceGetName(handle)))
        except nvml.NVMLError as exc:
            self._raise_if_gone(exc, f"GPU {index} handle")
            gpu = self._identity_at(index)
            if classify(nvml, exc) is ErrorKind.GPU_LOST:
                self._gpu_lost(gpu, f"GPU {index} handle: {error_text(exc)}", result)
            else:  # e.g. NoPermission: a GPU this container may not use is not ours to report
                self._log_once(gpu, "handle", error_text(exc))
            return
        samples: list[tuple[GpuIdentity, Sample]] = []
        try:
            for f in self._fields:
                samples.extend((gpu, s) for s in self._read_field(f, gpu, handle, stats))
        except GpuLostError as exc:
            self._gpu_lost(gpu, str(exc), result)  # partial readings of a lost GPU are dropped
            return
        result.samples.extend(samples)
        result.gpu_up[gpu.uuid] = (gpu, True)
        self._known[gpu.uuid] = gpu

    def _read_field(
        self, f: Field, gpu: GpuIdentity, handle: object, stats: dict[str, CollectorStat]
    ) -> list[Sample]:
        nvml = self._session.nvml
        stat = stats.setdefault(f.collector, CollectorStat())  # reported even when every field is absent
        if (gpu.uuid, f.key) in self._absent:
            return []
        start = self._timer()
        try:
            return f.read(nvml, handle)
        except nvml.NVMLError as exc:
            self._raise_if_gone(exc, f"GPU {gpu.index} {f.key}")
            kind = classify(nvml, exc)
            if kind is ErrorKind.ABSENT:
                self._absent.add((gpu.uuid, f.key))
                return []
            stat.success = False
            if kind is ErrorKind.GPU_LOST:
                raise GpuLostError(f"GPU {gpu.index} ({gpu.uuid}) {f.key}: {error_text(exc)}") from exc
            self._log_once(gpu, f.key, error_text(exc))
        except Exception as exc:  # noqa: BLE001 - one odd value or binding quirk must not fail the scrape
            stat.success = False
            self._log_once(gpu, f.key, f"{type(exc).__name__}: {exc}")
        finally:
            stat.duration_s += self._timer() - start
        return []

    def _raise_if_gone(self, exc: BaseException, where: str) -> None:
        if classify(self._session.nvml, exc) is ErrorKind.NVML_GONE:
            raise NvmlGoneError(f"{where}: {error_text(exc)}") from exc

    def _gpu_lost(self, gpu: GpuIdentity, reason: str, result: ScrapeResult) -> None:
        log.error("GPU lost: %s; marking it down and re-initialising NVML", reason)
        result.gpu_up[gpu.uuid or f"#{gpu.index}"] = (gpu, False)
        self._session.request_reinit(reason, self._scrape_generation)

    def _identity_at(self, index: int) -> GpuIdentity:
        """Labels for a GPU that cannot be asked its UUID: the last one seen at this index."""
        for gpu in self._known.values():
            if gpu.index == index:
                return gpu
        return GpuIdentity(index, "", "")

    def _log_once(self, gpu: GpuIdentity, key: str, text: str) -> None:
        if (gpu.uuid, key, text) not in self._logged:
            self._logged.add((gpu.uuid, key, text))
            log.warning("GPU %d (%s) %s unreadable: %s; omitted", gpu.index, gpu.uuid, key, text)

    def _add_gpus(self, families: Families, result: ScrapeResult) -> None:
        states = dict(result.gpu_up)
        for uuid, gpu in self._known.items():  # known GPUs missing from this scrape are down
            states.setdefault(uuid, (gpu, False))
        for gpu, up in sorted(states.values(), key=lambda state: (state[0].index, state[0].uuid)):
            families.add("llm_gpu_up", gpu.labels, 1.0 if up else 0.0)
        for gpu, (name, extra, value) in result.samples:
            families.add(name, gpu.labels + extra, value)

    def _add_health(self, families: Families, stats: dict[str, CollectorStat]) -> None:
        session = self._session
        families.add("llm_gpu_nvml_up", (), 1.0 if session.up else 0.0)
        if session.up:
            versions = session.versions
            families.add(
                "llm_gpu_nvml_info",
                tuple(versions.get(k, "") for k in ("driver_version", "nvml_version", "cuda_driver_version")),
                1.0,
            )
        elif session.last_error is not None:
            families.add("llm_gpu_nvml_error_info", (session.last_error,), 1.0)
        num_ok = session.num_init_attempts - session.num_init_failures
        families.add("llm_gpu_nvml_init_attempts_total", ("success",), float(num_ok))
        families.add("llm_gpu_nvml_init_attempts_total", ("failure",), float(session.num_init_failures))
        for name, stat in stats.items():
            families.add("llm_gpu_collector_success", (name,), 1.0 if stat.success else 0.0)
            families.add("llm_gpu_collector_duration_seconds", (name,), max(stat.duration_s, 0.0))

    def _add_xid(self, families: Families) -> None:
        if self._xid is None:
            return
        start = self._timer()
        for record in self._xid.records():
            labels = record.gpu_labels + (str(record.xid),)
            families.add("llm_gpu_xid_errors_total", labels, float(record.count))
            families.add("llm_gpu_xid_last_seen_timestamp_seconds", labels, record.last_seen_ts)
        families.add("llm_gpu_collector_success", ("xid",), 1.0 if self._xid.healthy else 0.0)
        families.add("llm_gpu_collector_duration_seconds", ("xid",), self._timer() - start)
