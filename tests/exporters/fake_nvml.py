"""A fake NVML: pynvml's function names, constants and real error classes, driven by per-GPU state."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml


@dataclass(slots=True)
class FakeGpu:
    """One GPU's readings in NVML's own units (bytes, percent, mW, mJ, MHz)."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 85_520_809_984
    memory_reserved: int = 536_870_912
    memory_free: int = 4_294_967_296
    memory_used: int = 80_688_971_776  # total - reserved - free; NVML v1 counts reserved as used
    util_gpu: int = 87
    util_memory: int = 45
    temperature_c: int = 64
    power_mw: int = 512_345
    power_limit_mw: int = 700_000
    sm_clock_mhz: int = 1980
    memory_clock_mhz: int = 2619
    energy_mj: int = 123_456_789
    throttle_mask: int = 0x4 | 0x40  # sw_power_cap + hw_thermal
    pcie_replay: int = 3
    ecc_corrected: int = 7
    ecc_uncorrected: int = 0
    retired_single_bit: list[int] = field(default_factory=lambda: [0x1000, 0x2000])
    retired_double_bit: list[int] = field(default_factory=list)
    remapped_rows: tuple[int, int, int, int] = (2, 1, 0, 0)
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, usedGpuMemory)
    supported_events: int = pynvml.nvmlEventTypeXidCriticalError
    # function name -> error class it raises for this GPU (e.g. pynvml.NVMLError_NotSupported)
    errors: dict[str, type[pynvml.NVMLError]] = field(default_factory=dict)
    lost: bool = False  # every call on this GPU raises NVMLError_GpuIsLost
    # function name -> event the call blocks on until set (a driver stuck in D-state)
    hangs: dict[str, threading.Event] = field(default_factory=dict)
    # function name -> callable run first (it may raise, e.g. to act out a stale handle)
    hooks: dict[str, Callable[[], None]] = field(default_factory=dict)


@dataclass(slots=True)
class FakeEventSet:
    gpus: list[FakeGpu] = field(default_factory=list)
    events: queue.Queue = field(default_factory=queue.Queue)
    freed: bool = False


class FakeNvml:
    """Exposes the subset of pynvml the exporter calls; every error is a real pynvml error class."""

    def __init__(self, gpus: list[FakeGpu], library_present: bool = True):
        for name in dir(pynvml):  # constants and error classes, exactly as the binding has them
            if name.startswith(("NVML_", "NVMLError", "nvmlEventType", "nvmlClocks", "nvmlMemory_v")):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.library_present = library_present
        self.driver_loaded = True
        self.initialized = False
        self.num_init = 0
        self.num_shutdown = 0
        self.process_names: dict[int, str] = {}
        self.has_event_reasons = True
        self.has_memory_v2 = True
        self.event_sets: list[FakeEventSet] = []
        self._lock = threading.Lock()

    # lifecycle ---------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.num_init += 1
        if not self.library_present:
            raise pynvml.NVMLError_LibraryNotFound()
        if not self.driver_loaded:
            raise pynvml.NVMLError_DriverNotLoaded()
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._check()
        self.num_shutdown += 1
        self.initialized = False

    def _check(self) -> None:
        if not self.driver_loaded:
            raise pynvml.NVMLError_DriverNotLoaded()
        if not self.initialized:
            raise pynvml.NVMLError_Uninitialized()

    def _dev(self, handle: FakeGpu, fn: str) -> FakeGpu:
        self._check()
        if fn in handle.hooks:
            handle.hooks[fn]()
        if fn in handle.hangs:
            handle.hangs[fn].wait(60)
        if handle.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if fn in handle.errors:
            raise handle.errors[fn]()
        return handle

    # system --------------------------------------------------------------------------------------
    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return "550.54.15"

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._check()
        return "12.550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check()
        return 12040

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._check()
        if pid not in self.process_names:
            raise pynvml.NVMLError_NotFound()
        return self.process_names[pid]

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return self._dev(self.gpus[index], "nvmlDeviceGetHandleByIndex")

    # device fields ---------------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return self._dev(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return self._dev(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu, version: int | None = None) -> SimpleNamespace:
        g = self._dev(h, "nvmlDeviceGetMemoryInfo")
        if version is None:
            return SimpleNamespace(
                total=g.memory_total, free=g.memory_free, used=g.memory_total - g.memory_free
            )
        assert version == pynvml.nvmlMemory_v2
        if not self.has_memory_v2:  # a driver older than nvmlDeviceGetMemoryInfo_v2
            raise pynvml.NVMLError_FunctionNotFound()
        return SimpleNamespace(
            version=version,
            total=g.memory_total,
            reserved=g.memory_reserved,
            free=g.memory_free,
            used=g.memory_used,
        )

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> SimpleNamespace:
        g = self._dev(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=g.util_gpu, memory=g.util_memory)

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._dev(h, "nvmlDeviceGetTemperature").temperature_c

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return self._dev(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        return self._dev(h, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock: int) -> int:
        g = self._dev(h, "nvmlDeviceGetClockInfo")
        return {pynvml.NVML_CLOCK_SM: g.sm_clock_mhz, pynvml.NVML_CLOCK_MEM: g.memory_clock_mhz}[clock]

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        return self._dev(h, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        if not self.has_event_reasons:  # a driver older than the binding
            raise pynvml.NVMLError_FunctionNotFound()
        return self._dev(h, "nvmlDeviceGetCurrentClocksEventReasons").throttle_mask

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeGpu) -> int:
        return self._dev(h, "nvmlDeviceGetCurrentClocksThrottleReasons").throttle_mask

    def nvmlDeviceGetPcieReplayCounter(self, h: FakeGpu) -> int:
        return self._dev(h, "nvmlDeviceGetPcieReplayCounter").pcie_replay

    def nvmlDeviceGetTotalEccErrors(self, h: FakeGpu, error_type: int, counter_type: int) -> int:
        g = self._dev(h, "nvmlDeviceGetTotalEccErrors")
        assert counter_type == pynvml.NVML_VOLATILE_ECC
        return g.ecc_corrected if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else g.ecc_uncorrected

    def nvmlDeviceGetRetiredPages(self, h: FakeGpu, cause: int) -> list[int]:
        g = self._dev(h, "nvmlDeviceGetRetiredPages")
        single = pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        return list(g.retired_single_bit if cause == single else g.retired_double_bit)

    def nvmlDeviceGetRemappedRows(self, h: FakeGpu) -> tuple[int, int, int, int]:
        return self._dev(h, "nvmlDeviceGetRemappedRows").remapped_rows

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[SimpleNamespace]:
        g = self._dev(h, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in g.processes]

    # events ------------------------------------------------------------------------------------------
    def nvmlDeviceGetSupportedEventTypes(self, h: FakeGpu) -> int:
        return self._dev(h, "nvmlDeviceGetSupportedEventTypes").supported_events

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._check()
        event_set = FakeEventSet()
        with self._lock:
            self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, h: FakeGpu, event_types: int, event_set: FakeEventSet) -> None:
        g = self._dev(h, "nvmlDeviceRegisterEvents")
        assert event_types == pynvml.nvmlEventTypeXidCriticalError
        event_set.gpus.append(g)

    def nvmlEventSetWait(self, event_set: FakeEventSet, timeout_ms: int) -> SimpleNamespace:
        self._check()
        try:
            return event_set.events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise pynvml.NVMLError_Timeout() from None

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        self._check()
        event_set.freed = True

    def emit_xid(self, gpu: FakeGpu, xid: int) -> int:
        """Deliver an XID to every live event set the GPU is registered in; return how many got it."""
        num_delivered = 0
        with self._lock:
            for event_set in self.event_sets:
                if not event_set.freed and gpu in event_set.gpus:
                    event_set.events.put(
                        SimpleNamespace(
                            device=gpu,
                            eventType=pynvml.nvmlEventTypeXidCriticalError,
                            eventData=xid,
                            gpuInstanceId=0,
                            computeInstanceId=0,
                        )
                    )
                    num_delivered += 1
        return num_delivered
