"""GPU exporter metric definitions (names, types, help, labels: one source of truth), per-scrape builder."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

GPU_LABELS = ("gpu", "uuid", "name")


@dataclass(slots=True, frozen=True)
class MetricSpec:
    name: str  # full exposed name; counters end in _total, the info metric in _info
    kind: str  # "gauge" | "counter" | "info"
    help: str
    labels: tuple[str, ...]


def _gpu(name: str, kind: str, help_text: str, *extra: str) -> MetricSpec:
    return MetricSpec(name, kind, help_text, GPU_LABELS + extra)


SPECS: tuple[MetricSpec, ...] = (
    _gpu("llm_gpu_up", "gauge", "1 if the GPU answered NVML in this scrape, 0 if it is lost or gone."),
    _gpu("llm_gpu_memory_used_bytes", "gauge", "Framebuffer memory used (DCGM_FI_DEV_FB_USED)."),
    _gpu("llm_gpu_memory_free_bytes", "gauge", "Framebuffer memory free (DCGM_FI_DEV_FB_FREE)."),
    _gpu("llm_gpu_memory_total_bytes", "gauge", "Framebuffer memory total (used + free + reserved)."),
    _gpu(
        "llm_gpu_memory_reserved_bytes",
        "gauge",
        "Framebuffer memory reserved by the driver (DCGM_FI_DEV_FB_RESERVED).",
    ),
    _gpu(
        "llm_gpu_utilization_ratio",
        "gauge",
        "Share of the last sample period a kernel ran (DCGM_FI_DEV_GPU_UTIL / 100).",
    ),
    _gpu(
        "llm_gpu_memory_utilization_ratio",
        "gauge",
        "Share of the last sample period device memory was read or written (DCGM_FI_DEV_MEM_COPY_UTIL / 100).",
    ),
    _gpu("llm_gpu_temperature_celsius", "gauge", "GPU die temperature (DCGM_FI_DEV_GPU_TEMP)."),
    _gpu("llm_gpu_power_watts", "gauge", "Power draw (DCGM_FI_DEV_POWER_USAGE)."),
    _gpu("llm_gpu_power_limit_watts", "gauge", "Enforced power limit."),
    _gpu("llm_gpu_sm_clock_hz", "gauge", "SM clock (DCGM_FI_DEV_SM_CLOCK in MHz x 1e6)."),
    _gpu("llm_gpu_memory_clock_hz", "gauge", "Memory clock (DCGM_FI_DEV_MEM_CLOCK in MHz x 1e6)."),
    _gpu(
        "llm_gpu_energy_joules_total",
        "counter",
        "Energy consumed since the driver loaded (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION in mJ / 1000).",
    ),
    _gpu("llm_gpu_throttle_reason", "gauge", "1 if this clock event reason is active now, else 0.", "reason"),
    _gpu("llm_gpu_pcie_replay_total", "counter", "PCIe replays (DCGM_FI_DEV_PCIE_REPLAY_COUNTER)."),
    _gpu(
        "llm_gpu_ecc_corrected_errors_total",
        "counter",
        "Corrected (single-bit) ECC errors since the driver loaded (DCGM_FI_DEV_ECC_SBE_VOL_TOTAL).",
    ),
    _gpu(
        "llm_gpu_ecc_uncorrected_errors_total",
        "counter",
        "Uncorrected (double-bit) ECC errors since the driver loaded (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL).",
    ),
    _gpu(
        "llm_gpu_retired_pages_total",
        "counter",
        "Retired framebuffer pages by cause (DCGM_FI_DEV_RETIRED_SBE/DBE).",
        "cause",
    ),
    _gpu(
        "llm_gpu_remapped_rows_total",
        "counter",
        "Remapped memory rows by error type (DCGM_FI_DEV_{CORRECTABLE,UNCORRECTABLE}_REMAPPED_ROWS).",
        "type",
    ),
    _gpu("llm_gpu_row_remap_pending", "gauge", "1 if a row remap waits for a GPU reset."),
    _gpu(
        "llm_gpu_row_remap_failure", "gauge", "1 if row remapping has failed (DCGM_FI_DEV_ROW_REMAP_FAILURE)."
    ),
    _gpu(
        "llm_gpu_xid_errors_total", "counter", "XID errors seen by the NVML event thread, by XID code.", "xid"
    ),
    _gpu("llm_gpu_xid_last_seen_timestamp_seconds", "gauge", "Unix time the XID code was last seen.", "xid"),
    _gpu(
        "llm_gpu_process_memory_used_bytes",
        "gauge",
        "GPU memory used by a compute process (higher cardinality: off with --no-process-metrics).",
        "pid",
        "process",
    ),
    MetricSpec("llm_gpu_nvml_up", "gauge", "1 if NVML is initialised and answering, else 0.", ()),
    MetricSpec(
        "llm_gpu_nvml_info",
        "info",
        "Driver, NVML and CUDA driver versions.",
        ("driver_version", "nvml_version", "cuda_driver_version"),
    ),
    MetricSpec(
        "llm_gpu_nvml_error_info", "info", "While NVML is down: why, in NVML's words (gauge 1).", ("error",)
    ),
    MetricSpec("llm_gpu_nvml_init_attempts_total", "counter", "nvmlInit calls, by result.", ("result",)),
    MetricSpec(
        "llm_gpu_collector_success",
        "gauge",
        "1 if the collector read without unexpected errors.",
        ("collector",),
    ),
    MetricSpec(
        "llm_gpu_collector_duration_seconds",
        "gauge",
        "Time the collector took in this scrape.",
        ("collector",),
    ),
)

SPEC_BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in SPECS}


def _new_family(spec: MetricSpec) -> Metric:
    if spec.kind == "counter":
        return CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
    if spec.kind == "info":
        return InfoMetricFamily(
            spec.name.removesuffix("_info"), spec.help
        )  # spec.labels go in the value dict
    return GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)


class Families:
    """The families of one scrape; only those that received a sample are exposed."""

    def __init__(self) -> None:
        self._families = {spec.name: _new_family(spec) for spec in SPECS}

    def add(self, name: str, label_values: tuple[str, ...], value: float) -> None:
        spec = SPEC_BY_NAME[name]
        if len(label_values) != len(spec.labels):
            raise ValueError(f"{name}: {len(label_values)} label values for labels {spec.labels}")
        family = self._families[name]
        if spec.kind == "info":
            family.add_metric([], dict(zip(spec.labels, label_values, strict=True)))
        else:
            family.add_metric(list(label_values), value)

    def __iter__(self) -> Iterator[Metric]:
        return (family for family in self._families.values() if family.samples)
