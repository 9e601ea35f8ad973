"""Pure logic of the nvidia-smi cross-check: parse `--format=csv,nounits` output and a scrape, compare them."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from exporters.fields import THROTTLE_REASON_BITS

MIB = 1024.0 * 1024.0
KNOWN_REASON_MASK = sum(bit for _, bit in THROTTLE_REASON_BITS)


class SmiParseError(ValueError):
    """nvidia-smi output this script cannot read."""


@dataclass(slots=True, frozen=True)
class Check:
    smi_field: str  # nvidia-smi --query-gpu field
    metric: str  # exporter series name; "llm_gpu_throttle_reason" compares the whole bitmask
    labels: tuple[tuple[str, str], ...] = ()  # extra labels the series must carry
    scale: float = 1.0  # nvidia-smi's number (nounits) times scale = the exporter's unit
    abs_tol: float = 0.0  # in the exporter's unit
    rel_tol: float = 0.0


CHECKS: tuple[Check, ...] = (
    Check("memory.total", "llm_gpu_memory_total_bytes", scale=MIB, abs_tol=MIB),  # nvidia-smi floors to MiB
    Check("memory.used", "llm_gpu_memory_used_bytes", scale=MIB, abs_tol=2 * MIB),
    Check("memory.free", "llm_gpu_memory_free_bytes", scale=MIB, abs_tol=2 * MIB),
    Check("memory.reserved", "llm_gpu_memory_reserved_bytes", scale=MIB, abs_tol=MIB),
    Check("utilization.gpu", "llm_gpu_utilization_ratio", scale=0.01, abs_tol=0.10),  # sampled, moves fast
    Check("utilization.memory", "llm_gpu_memory_utilization_ratio", scale=0.01, abs_tol=0.10),
    Check("temperature.gpu", "llm_gpu_temperature_celsius", abs_tol=2.0),
    Check("power.draw", "llm_gpu_power_watts", abs_tol=5.0, rel_tol=0.05),
    Check("enforced.power.limit", "llm_gpu_power_limit_watts", abs_tol=0.5),
    Check("clocks.sm", "llm_gpu_sm_clock_hz", scale=1e6, abs_tol=30e6, rel_tol=0.05),
    Check("clocks.mem", "llm_gpu_memory_clock_hz", scale=1e6, abs_tol=30e6, rel_tol=0.05),
    Check("ecc.errors.corrected.volatile.total", "llm_gpu_ecc_corrected_errors_total"),
    Check("ecc.errors.uncorrected.volatile.total", "llm_gpu_ecc_uncorrected_errors_total"),
    Check("retired_pages.single_bit_ecc.count", "llm_gpu_retired_pages_total", (("cause", "single_bit"),)),
    Check("retired_pages.double_bit.count", "llm_gpu_retired_pages_total", (("cause", "double_bit"),)),
    Check("remapped_rows.correctable", "llm_gpu_remapped_rows_total", (("type", "correctable"),)),
    Check("remapped_rows.uncorrectable", "llm_gpu_remapped_rows_total", (("type", "uncorrectable"),)),
    Check("remapped_rows.pending", "llm_gpu_row_remap_pending"),
    Check("remapped_rows.failure", "llm_gpu_row_remap_failure"),
    Check("clocks_event_reasons.active", "llm_gpu_throttle_reason"),
    Check("clocks_throttle_reasons.active", "llm_gpu_throttle_reason"),
)

# One query per group: an unknown field makes nvidia-smi refuse the whole query, so the optional
# ones go separately and a refusal only skips that group.
CORE_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "memory.used",
    "memory.free",
    "utilization.gpu",
    "utilization.memory",
    "temperature.gpu",
    "power.draw",
    "enforced.power.limit",
    "clocks.sm",
    "clocks.mem",
)
OPTIONAL_GROUPS: tuple[tuple[str, ...], ...] = (
    ("memory.reserved",),
    ("ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total"),
    ("retired_pages.single_bit_ecc.count", "retired_pages.double_bit.count"),
    (
        "remapped_rows.correctable",
        "remapped_rows.uncorrectable",
        "remapped_rows.pending",
        "remapped_rows.failure",
    ),
    ("clocks_event_reasons.active",),
    ("clocks_throttle_reasons.active",),  # drivers before the "event" renaming
)

Labels = tuple[tuple[str, str], ...]
Scrape = dict[tuple[str, str, Labels], float]  # (metric, uuid, extra labels) -> value


@dataclass(slots=True)
class Verdict:
    uuid: str
    field: str
    smi: float | None  # in the exporter's unit; None: nvidia-smi says not available
    exporter: tuple[float, ...]  # the values in the scrapes around the nvidia-smi call
    status: str  # "ok" | "differs" | "missing" | "extra"


def parse_smi_csv(text: str) -> dict[str, dict[str, str]]:
    """`nvidia-smi --query-gpu=uuid,... --format=csv,nounits` -> {uuid: {field: raw value}}."""
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    if not rows or "uuid" not in [_field_name(h) for h in rows[0]]:
        raise SmiParseError(f"no header with a uuid column in nvidia-smi output: {text.strip()[:80]!r}")
    header = [_field_name(h) for h in rows[0]]
    out: dict[str, dict[str, str]] = {}
    for row in rows[1:]:
        if len(row) != len(header):
            raise SmiParseError(
                f"row has {len(row)} values for {len(header)} columns: {', '.join(row)[:80]!r}"
            )
        values = dict(zip(header, (v.strip() for v in row), strict=True))
        out[values["uuid"]] = values
    return out


def _field_name(header: str) -> str:
    return header.split(" [", 1)[0].strip()  # "memory.used [MiB]" -> "memory.used"


def smi_number(raw: str, check: Check) -> float | None:
    """A value in the exporter's unit; None for [N/A], [Not Supported] and the like."""
    if not raw or raw.startswith("[") or raw.upper() in ("N/A", "NA"):
        return None
    if check.metric == "llm_gpu_throttle_reason":
        return float(int(raw, 16) & KNOWN_REASON_MASK)
    if raw in ("Yes", "No"):
        return 1.0 if raw == "Yes" else 0.0
    try:
        return float(raw) * check.scale
    except ValueError:
        raise SmiParseError(f"{check.smi_field}: not a number: {raw!r}") from None


def parse_scrape(text: str) -> Scrape:
    """Exporter text format -> {(metric, uuid, extra labels): value}; throttle reasons folded into a mask."""
    out: Scrape = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            uuid = labels.pop("uuid", "")
            labels.pop("gpu", None)
            labels.pop("name", None)
            if sample.name == "llm_gpu_throttle_reason":
                bit = dict(THROTTLE_REASON_BITS)[labels["reason"]]
                mask_key = (sample.name, uuid, ())
                out[mask_key] = out.get(mask_key, 0.0) + (bit if sample.value else 0)
                continue
            out[(sample.name, uuid, tuple(sorted(labels.items())))] = sample.value
    return out


def compare(smi: dict[str, dict[str, str]], scrapes: list[Scrape]) -> list[Verdict]:
    """Each nvidia-smi value against the exporter's values in the scrapes taken before and after it."""
    verdicts = []
    for uuid, fields in sorted(smi.items()):
        for check in CHECKS:
            if check.smi_field not in fields:
                continue
            value = smi_number(fields[check.smi_field], check)
            series = (check.metric, uuid, tuple(sorted(check.labels)))
            seen = tuple(s[series] for s in scrapes if series in s)
            verdicts.append(Verdict(uuid, check.smi_field, value, seen, _status(check, value, seen)))
    return verdicts


def _status(check: Check, smi: float | None, seen: tuple[float, ...]) -> str:
    if smi is None:
        return "extra" if seen else "ok"  # the exporter must omit what the GPU does not support
    if not seen:
        return "missing"
    if check.metric == "llm_gpu_throttle_reason":
        return "ok" if smi in seen else "differs"
    tol = max(check.abs_tol, check.rel_tol * abs(smi))
    return "ok" if min(seen) - tol <= smi <= max(seen) + tol else "differs"


def format_report(verdicts: list[Verdict]) -> str:
    lines = [f"{'uuid':<42} {'nvidia-smi field':<40} {'nvidia-smi':>16} {'exporter':>33}  status"]
    for v in verdicts:
        smi = "n/a" if v.smi is None else f"{v.smi:.6g}"
        seen = " .. ".join(f"{x:.6g}" for x in sorted(set(v.exporter))) or "absent"
        lines.append(f"{v.uuid:<42} {v.field:<40} {smi:>16} {seen:>33}  {v.status}")
    bad = [v for v in verdicts if v.status != "ok"]
    lines.append(f"{len(verdicts)} compared, {len(bad)} not ok")
    return "\n".join(lines)


def parse_apps_csv(text: str) -> list[tuple[str, str, float | None]]:
    """`nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,nounits` -> (uuid, pid, bytes)."""
    rows = [r for r in csv.reader(io.StringIO(text.strip()), skipinitialspace=True) if r]
    if not rows or _field_name(rows[0][0]) != "gpu_uuid":
        raise SmiParseError(f"no gpu_uuid header in nvidia-smi compute-apps output: {text.strip()[:80]!r}")
    apps = []
    for row in rows[1:]:
        if len(row) != 3:
            raise SmiParseError(
                f"compute-apps row has {len(row)} values, expected 3: {', '.join(row)[:80]!r}"
            )
        uuid, pid, used = (v.strip() for v in row)
        apps.append((uuid, pid, smi_number(used, Check("used_memory", "", scale=MIB))))
    return apps


def compare_processes(apps: list[tuple[str, str, float | None]], scrapes: list[Scrape]) -> list[Verdict]:
    """Each compute process nvidia-smi lists against llm_gpu_process_memory_used_bytes{pid}."""
    verdicts = []
    check = Check("used_memory", "llm_gpu_process_memory_used_bytes", abs_tol=MIB)
    for uuid, pid, used in apps:
        seen = tuple(
            value
            for s in scrapes
            for (metric, u, labels), value in s.items()
            if metric == check.metric and u == uuid and ("pid", pid) in labels
        )
        verdicts.append(Verdict(uuid, f"process {pid} used_memory", used, seen, _status(check, used, seen)))
    return verdicts
