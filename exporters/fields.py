"""Per-GPU field readers: one NVML call each, converted to base units (W, J, Hz, ratios, bytes)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from exporters.nvml import ErrorKind, Nvml, classify

# (metric name, extra label values after gpu/uuid/name, value)
Sample = tuple[str, tuple[str, ...], float]

# Clock event reason bits, the same in nvmlClocksEventReason* and the older nvmlClocksThrottleReason*.
THROTTLE_REASON_BITS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal", 0x20),
    ("hw_thermal", 0x40),
    ("hw_power_brake", 0x80),
    ("display_clocks", 0x100),
)


class ImplausibleValueError(ValueError):
    """NVML returned a value outside its documented range (go-dcgm#75 saw GPU_UTIL 4294967295)."""


@dataclass(slots=True, frozen=True)
class Field:
    collector: str  # the group reported in llm_gpu_collector_success{collector}
    key: str  # unique per field; NotSupported is remembered per (GPU, key)
    read: Callable[[Nvml, object], list[Sample]]


def _percent_to_ratio(value: int, what: str) -> float:
    if not 0 <= value <= 100:
        raise ImplausibleValueError(f"{what} {value}% out of range")
    return value / 100.0


def read_memory(nvml: Nvml, h: object) -> list[Sample]:
    """Bytes. v2 splits out what the driver reserves, as nvidia-smi and DCGM do; v1 counts it as used."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(h, version=version)
        except nvml.NVMLError as exc:
            if classify(nvml, exc) is not ErrorKind.ABSENT:  # older driver: fall back to v1 below
                raise
        else:
            return [
                ("llm_gpu_memory_used_bytes", (), float(info.used)),
                ("llm_gpu_memory_free_bytes", (), float(info.free)),
                ("llm_gpu_memory_total_bytes", (), float(info.total)),
                ("llm_gpu_memory_reserved_bytes", (), float(info.reserved)),
            ]
    info = nvml.nvmlDeviceGetMemoryInfo(h)
    return [
        ("llm_gpu_memory_used_bytes", (), float(info.used)),
        ("llm_gpu_memory_free_bytes", (), float(info.free)),
        ("llm_gpu_memory_total_bytes", (), float(info.total)),
    ]


def read_utilization(nvml: Nvml, h: object) -> list[Sample]:
    rates = nvml.nvmlDeviceGetUtilizationRates(h)  # percent
    return [
        ("llm_gpu_utilization_ratio", (), _percent_to_ratio(rates.gpu, "GPU utilization")),
        ("llm_gpu_memory_utilization_ratio", (), _percent_to_ratio(rates.memory, "memory utilization")),
    ]


def read_temperature(nvml: Nvml, h: object) -> list[Sample]:
    celsius = nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)
    return [("llm_gpu_temperature_celsius", (), float(celsius))]


def read_power(nvml: Nvml, h: object) -> list[Sample]:
    return [("llm_gpu_power_watts", (), nvml.nvmlDeviceGetPowerUsage(h) / 1000.0)]  # mW


def read_power_limit(nvml: Nvml, h: object) -> list[Sample]:
    return [("llm_gpu_power_limit_watts", (), nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)]  # mW


def read_sm_clock(nvml: Nvml, h: object) -> list[Sample]:
    return [("llm_gpu_sm_clock_hz", (), nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM) * 1e6)]  # MHz


def read_memory_clock(nvml: Nvml, h: object) -> list[Sample]:
    return [("llm_gpu_memory_clock_hz", (), nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM) * 1e6)]  # MHz


def read_energy(nvml: Nvml, h: object) -> list[Sample]:
    return [("llm_gpu_energy_joules_total", (), nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0)]  # mJ


def _throttle_samples(mask: int) -> list[Sample]:
    return [
        ("llm_gpu_throttle_reason", (reason,), 1.0 if mask & bit else 0.0)
        for reason, bit in THROTTLE_REASON_BITS
    ]


def read_throttle(nvml: Nvml, h: object) -> list[Sample]:
    """Clock event reasons; drivers older than the 'event' naming only have the throttle call."""
    current = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if current is not None:
        try:
            return _throttle_samples(current(h))
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) != nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
    return _throttle_samples(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))


def read_pcie_replay(nvml: Nvml, h: object) -> list[Sample]:
    return [("llm_gpu_pcie_replay_total", (), float(nvml.nvmlDeviceGetPcieReplayCounter(h)))]


def read_ecc_corrected(nvml: Nvml, h: object) -> list[Sample]:
    count = nvml.nvmlDeviceGetTotalEccErrors(h, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC)
    return [("llm_gpu_ecc_corrected_errors_total", (), float(count))]


def read_ecc_uncorrected(nvml: Nvml, h: object) -> list[Sample]:
    count = nvml.nvmlDeviceGetTotalEccErrors(
        h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
    )
    return [("llm_gpu_ecc_uncorrected_errors_total", (), float(count))]


def read_retired_single_bit(nvml: Nvml, h: object) -> list[Sample]:
    pages = nvml.nvmlDeviceGetRetiredPages(h, nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    return [("llm_gpu_retired_pages_total", ("single_bit",), float(len(pages)))]


def read_retired_double_bit(nvml: Nvml, h: object) -> list[Sample]:
    pages = nvml.nvmlDeviceGetRetiredPages(h, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    return [("llm_gpu_retired_pages_total", ("double_bit",), float(len(pages)))]


def read_remapped_rows(nvml: Nvml, h: object) -> list[Sample]:
    correctable, uncorrectable, pending, failure = nvml.nvmlDeviceGetRemappedRows(h)
    return [
        ("llm_gpu_remapped_rows_total", ("correctable",), float(correctable)),
        ("llm_gpu_remapped_rows_total", ("uncorrectable",), float(uncorrectable)),
        ("llm_gpu_row_remap_pending", (), 1.0 if pending else 0.0),
        ("llm_gpu_row_remap_failure", (), 1.0 if failure else 0.0),
    ]


def _process_name(nvml: Nvml, pid: int) -> str:
    """Basename of the process NVML reports; "unknown" when it exited or we may not look."""
    try:
        name = nvml.nvmlSystemGetProcessName(pid)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) in (
            nvml.NVML_ERROR_NOT_FOUND,
            nvml.NVML_ERROR_NO_PERMISSION,
            nvml.NVML_ERROR_NOT_SUPPORTED,
        ):
            return "unknown"
        raise
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return os.path.basename(str(name)) or "unknown"


def read_processes(nvml: Nvml, h: object) -> list[Sample]:
    """Compute processes' memory; one series per (pid, process), summed over MIG instances."""
    by_process: dict[tuple[str, str], float] = {}
    for proc in nvml.nvmlDeviceGetComputeRunningProcesses(h):
        if proc.usedGpuMemory is None:  # not available (WDDM, some MIG setups): omit, never 0
            continue
        key = (str(proc.pid), _process_name(nvml, proc.pid))
        by_process[key] = by_process.get(key, 0.0) + float(proc.usedGpuMemory)
    return [("llm_gpu_process_memory_used_bytes", key, used) for key, used in sorted(by_process.items())]


DEVICE_FIELDS: tuple[Field, ...] = (
    Field("memory", "memory", read_memory),
    Field("utilization", "utilization", read_utilization),
    Field("temperature", "temperature", read_temperature),
    Field("power", "power", read_power),
    Field("power", "power_limit", read_power_limit),
    Field("clocks", "sm_clock", read_sm_clock),
    Field("clocks", "memory_clock", read_memory_clock),
    Field("energy", "energy", read_energy),
    Field("throttle", "throttle", read_throttle),
    Field("pcie", "pcie_replay", read_pcie_replay),
    Field("ecc", "ecc_corrected", read_ecc_corrected),
    Field("ecc", "ecc_uncorrected", read_ecc_uncorrected),
    Field("retired_pages", "retired_single_bit", read_retired_single_bit),
    Field("retired_pages", "retired_double_bit", read_retired_double_bit),
    Field("remapped_rows", "remapped_rows", read_remapped_rows),
)
PROCESS_FIELD = Field("processes", "processes", read_processes)
